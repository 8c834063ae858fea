"""What the openai engine needs of `rollout.*` (`tirl.rollout.engines.registry`): no keys of its own, since every
key it reads the vllm engine reads too when it samples from servers someone else started."""

# a server tirl does not start: where it is and the model it serves (checked as the config loads)
REQUIRED_KEYS = ("urls", "model_name")
