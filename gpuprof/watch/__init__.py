"""`gpuprof watch`: a flight recorder for a long training run.

The script runs to its end under diagnose's hooks (the timer in bounded mode: a uniform sample of
the steps is kept, not every step). Each closed step's host figures reach the recorder
(recorder.py) through the timer's listener; every `--every` (seconds or steps) it closes a window:
the window's figures (windows.py, from gpuprof.stats: one definition of the typical step), the
samplers' figures over it (counters.py), a change test against the windows before it
(changes.py: Pettitt's rank test with a minimum effect of the run's own window-to-window noise;
periodic spikes recognised by their step pattern), the likely causes of a change (causes.py),
one JSON line in the events file (events.py, flushed and fsync'd), the Prometheus gauges
(prometheus.py). The final report is diagnose's over the whole run, with the changes in order
(gpuprof.report.watch words them, gpuprof.render.watch lays them out).
"""
