"""Measurements of a live run: memory next to the prediction (`memory`), the advice on
what frees the most (`memory_advice`), a CPU step's peak of tensor memory (`cpu_peak`),
the profiler (`profiler`), the step clock
(`step_clock`), the largest micro-batch (`batch_finder`), the planner's probes
(`plan_probe`) and a run's measured MFU and HFU (`utilisation`)."""
