"""What runs leave for people: figures drawn from run files, and the live page of a run."""
