"""Hypothesis settings of the fuzz tests (bad input: readers, configs, paths).

Two profiles, registered in ``tests/conftest.py``: the default keeps ``make test``
quick (:data:`QUICK_EXAMPLES` inputs per fuzz test); ``--hypothesis-profile=chaos``
(``make fuzz``, and ``make chaos``) tries :data:`CHAOS_EXAMPLES` inputs per fuzz test,
the issue's "at least 500 fuzzed inputs per reader".
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

QUICK_EXAMPLES = 40
CHAOS_EXAMPLES = 600
CHAOS_PROFILE = "chaos"


def fuzz_settings(**overrides) -> settings:
    """Settings for one fuzz test: the example count follows the active profile."""
    chaos = settings.get_current_profile_name() == CHAOS_PROFILE
    return settings(
        max_examples=CHAOS_EXAMPLES if chaos else QUICK_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
        **overrides,
    )
