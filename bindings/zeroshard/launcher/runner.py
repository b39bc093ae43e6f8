"""deepspeed.launcher.runner: DEEPSPEED_ENVIRONMENT_NAME, the file of NAME=VALUE lines the
launcher exports to every host (`zeroshard` reads it from the home and working folders)."""
from .._tools.launcher import ENV_FILE as DEEPSPEED_ENVIRONMENT_NAME  # noqa: F401
