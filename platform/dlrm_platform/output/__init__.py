"""What a user sees while a job runs: stage lines, a progress bar per epoch, the run's log file.

A job's terminal shows one line per stage, a bar per epoch (plain lines when
stdout is not a terminal: ``ray job submit``, the job service's Ray Jobs, CI),
the tuner's decisions and the summary. Everything else (library logs, Ray's and
the training workers' output) goes to the run's log file; ``--verbose`` prints
it on the terminal too.

- :mod:`.terminal`: the one writer of the terminal (lines and a live bar share it).
- :mod:`.run_log`: the run's log file and which records reach the terminal.
- :mod:`.worker_logs`: the output Ray forwards from workers, as log records (the
  one touch of a private Ray name here); a worker's own log format.
- :mod:`.progress`: rank 0's progress, sent once per log window to a small actor
  the driver polls.
- :mod:`.progress_events`: what that progress is: one typed event per kind, validated on arrival.
- :mod:`.progress_view`: how that progress is drawn: a tqdm bar, or plain lines.

Nothing here imports torch; the worker side (``progress.ProgressSink``,
``worker_logs.configure_worker_logging``) imports Ray only when used.
"""
