"""The learning loop: GRPO math, configuration, the policy (LoRA and reference), rollouts,
evaluation and calibration, the trainer and its data-parallel helpers."""
