"""deepspeed.utils.timer: the timer names DeepSpeed's engine reports under
(wall_clock_breakdown)."""
FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER = "fwd_microstep", "fwd"
BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER = "bwd_microstep", "bwd"
BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner_microstep", "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce_microstep", "bwd_allreduce"
STEP_MICRO_TIMER, STEP_GLOBAL_TIMER = "step_microstep", "step"
