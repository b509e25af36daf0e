"""The engine: the block compiler and the runners that execute a loaded method's state
(:class:`ptexec.loader.state.MethodState`, which :mod:`ptexec.loader` makes).

- :mod:`.blocks`: basic blocks compiled into functions, plain or instrumented;
- :mod:`.hooks`: what tools see of an instruction, and the hooks they implement;
- :mod:`.runner`, :mod:`.cuda_graph`: the runners, chosen once at load;
- :mod:`.arguments`: a call's inputs and outputs in and out of the values table;
- :mod:`.fastcall`: the common call as one generated function.
"""
