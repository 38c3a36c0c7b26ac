"""Test speed-up: Triton 3.6's interpreter re-patches ``triton.language`` on every call of a nested @triton.jit
function (``InterpretedFunction.__call__`` -> ``_patch_lang``: ``inspect.getmembers`` over tl, tl.tensor, tl.math
and their wrappers, for each call), about 40% of an interpreted decode step here. Inside a kernel launch
(``GridExecutor.__call__``), whose own ``_patch_lang`` has already patched the same language modules with the same
builder, that repeat changes nothing: ``install()`` skips it there, and only there (a nested function that sees a
language module not yet patched in this launch, such as tl.core for tl.zeros and tl.sum, still patches, as before;
nothing restores a patch before the launch ends, and the launch's restore is unchanged).
The kernels run the same interpreted operations on the same data, so every test checks what it checked before.

Installed by tests/conftest.py and the TP test ranks (tests/tp_worker.py); not in subprocesses that start
``onekernel`` itself (the CLI's --tp launcher, ``onekernel serve``). ONEKERNEL_TEST_PLAIN_INTERPRETER=1 leaves
Triton as it is; so does a Triton whose interpreter does not have the code this expects.
"""
import inspect
import os
import threading


def install() -> bool:
    """Patch triton.runtime.interpreter (once per process); True when the speed-up is active."""
    if os.environ.get("ONEKERNEL_TEST_PLAIN_INTERPRETER") == "1":
        return False
    import triton.language as tl
    from triton.runtime import interpreter as interp

    if getattr(interp, "_onekernel_fast", False):
        return True
    try:
        grid_src = inspect.getsource(interp.GridExecutor.__call__)
        fn_src = inspect.getsource(interp.InterpretedFunction.__call__)
    except (AttributeError, OSError, TypeError):
        return False
    if ("patch_scope = _patch_lang(self.fn)" not in grid_src or "patch_scope.restore()" not in grid_src
            or "_patch_lang(self.fn)" not in fn_src or not hasattr(interp, "_LangPatchScope")):
        return False  # another interpreter than Triton 3.6's: leave it alone

    patch_lang, grid_call = interp._patch_lang, interp.GridExecutor.__call__
    state = threading.local()  # state.stack: per enclosing launch, the language modules patched in it so far

    def langs(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def fast_patch_lang(fn):
        stack = getattr(state, "stack", None)
        if not stack:  # outside a launch
            return patch_lang(fn)
        mine = langs(fn)
        if stack[-1] is not None and mine <= stack[-1]:
            return interp._LangPatchScope()  # nothing to patch: already patched in the enclosing launch
        scope = patch_lang(fn)  # the launch's own patch, or a nested one that sees another module (tl.core)
        stack[-1] = mine | (stack[-1] or frozenset())  # nothing restores either until the launch ends
        return scope

    def fast_grid_call(self, *args, **kwargs):
        if not hasattr(state, "stack"):
            state.stack = []
        state.stack.append(None)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            state.stack.pop()

    interp._patch_lang = fast_patch_lang
    interp.GridExecutor.__call__ = fast_grid_call
    interp._onekernel_fast = True
    return True
