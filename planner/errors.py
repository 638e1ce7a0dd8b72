"""Errors that reach the user as one line and a documented exit code (docs/cli.md)."""

from __future__ import annotations

EXIT_FITS = 0
"""A candidate fits (the gate: admit). Also a job at risk when the at_risk policy is admit or
warn (planner.error_bands.AT_RISK_POLICIES; warn adds a warning with the probability of
running out of memory)."""
EXIT_CRASH = 1
EXIT_USAGE = 2
EXIT_NOTHING_FITS = 3
"""Nothing fits (the gate: reject), or only candidates at risk under at_risk reject."""
EXIT_BAD_DATA = 4
EXIT_TRACE_REFUSED = 5
"""A traced answer cannot be given (the model cannot be traced), or a probe failed
(`fitcheck trace`, `fitcheck --from-trace`)."""
EXIT_NO_VERDICT = 6
"""The gate gave no verdict: it could not be started, crashed or timed out, and the failure
policy refuses the job (`fitcheck-sbatch --fitcheck-on-error reject`; the Slurm controller
check's answer to job_submit.lua). Never a rejection: that is 3."""


class FitcheckError(Exception):
    exit_code = EXIT_CRASH


class UsageError(FitcheckError):
    """A flag or argument is wrong (click's own usage errors share exit code 2)."""

    exit_code = EXIT_USAGE


class InputDataError(FitcheckError):
    """A file the user pointed at is bad: hardware profile, config.json, calibration."""

    exit_code = EXIT_BAD_DATA
