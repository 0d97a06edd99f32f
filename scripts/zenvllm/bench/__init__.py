"""The benchmark: stock against the planner's layouts with `vllm bench`.

Stays on the machine that benchmarks; hosts and images never receive it.
"""
