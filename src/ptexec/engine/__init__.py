"""The engine: a loaded method's state, the block compiler and the runners that execute it.

- :mod:`.state`: :class:`~.state.MethodState`, everything loading produced, as data;
- :mod:`.effects`: what an instruction reads and writes;
- :mod:`.dataflow`: the load-time rewrites (copies as views, constant folding);
- :mod:`.blocks`: basic blocks compiled into functions, plain or instrumented;
- :mod:`.hooks`: what tools see of an instruction, and the hooks they implement;
- :mod:`.runner`, :mod:`.cuda_graph`: the runners, chosen once at load;
- :mod:`.arguments`: a call's inputs and outputs in and out of the values table;
- :mod:`.fastcall`: the common call as one generated function.
"""
