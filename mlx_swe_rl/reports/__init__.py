"""What runs leave for people: figures drawn from run files, and comparison experiments."""
