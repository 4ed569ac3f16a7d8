"""`gpuprof attach PID`: diagnose a training run that is already going, from outside it."""
