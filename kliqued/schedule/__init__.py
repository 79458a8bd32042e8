"""Schedules and pipelines: the unattended channels (issue 14). ``cron`` and ``pipeline`` are
pure (time and a file in, decisions out); the daemon keeps their state in its event log
(kliqued/daemon/state/schedules.py, kliqued/daemon/state/pipelines.py)."""
