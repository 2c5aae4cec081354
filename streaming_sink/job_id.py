"""The rule a job id follows: it names the job's journal (Redis keys, file-store folders), metrics and liveness."""
from __future__ import annotations

import re

JOB_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
JOB_ID = re.compile(JOB_ID_PATTERN)
JOB_ID_RULE = "1-64 letters, digits, '.', '_' or '-'"  # the pattern in words, for error messages
