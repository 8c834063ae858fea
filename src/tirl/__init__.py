"""tirl: tool-integrated reinforcement learning."""

__version__ = "0.1.0"
