"""The environment a policy acts in: prompts and code extraction, rewards, and the gym-style
`CodeFixEnv` (reset / get_prompt / step)."""

from .codefix import CodeFixEnv

__all__ = ["CodeFixEnv"]
