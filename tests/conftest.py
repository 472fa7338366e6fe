"""Suite-wide test settings: the Hypothesis profiles of the fuzz tests (see tests/fuzzing.py)."""

from __future__ import annotations

import os

from hypothesis import settings

from fuzzing import CHAOS_EXAMPLES, CHAOS_PROFILE

# `pytest --hypothesis-profile=chaos` (or DLRM_HYPOTHESIS_PROFILE=chaos): 600+ inputs per fuzz test.
settings.register_profile(CHAOS_PROFILE, max_examples=CHAOS_EXAMPLES, deadline=None, print_blob=True)
if os.environ.get("DLRM_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["DLRM_HYPOTHESIS_PROFILE"])
