"""The TUI's terminal driver: Textual's Linux driver, with input that cannot crash it.

Textual 8.2.8's `LinuxDriver.run_input_thread` decodes the terminal's bytes with a strict UTF-8
decoder: one byte that is not UTF-8 (b"caf\\xe9" from a Latin-1 terminal, a binary paste) raises
UnicodeDecodeError in the input thread, which ends the app - the draft is lost and the rest of a
paste goes to the shell. `LenientLinuxDriver` runs that very method (the same code object, not a
copy) with two of its global names resolved differently: `getincrementaldecoder` makes decoders
that turn invalid bytes into U+FFFD, and `XTermParser` is `PasteSafeParser` (nothing inside a
bracketed paste becomes a key press). Textual's own module is left as it is.
tests/tui/test_terminal_input.py fails if Textual stops looking these names up there.
"""

from __future__ import annotations

import codecs
import functools
import types
from typing import Any, Callable

from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver

from lampo.tui.paste_guard import PasteSafeParser


def replacing_decoder(encoding: str) -> Callable[..., codecs.IncrementalDecoder]:
    """`codecs.getincrementaldecoder(encoding)`, whose decoders replace invalid input by default."""
    return functools.partial(codecs.getincrementaldecoder(encoding), errors="replace")


def _with_globals(function: types.FunctionType, **names: Any) -> types.FunctionType:
    """`function`'s code, run with `names` looked up as given instead of in its module."""
    rebound = types.FunctionType(function.__code__, {**function.__globals__, **names},
                                 function.__name__, function.__defaults__, function.__closure__)
    rebound.__qualname__, rebound.__doc__ = function.__qualname__, function.__doc__
    return rebound


class LenientLinuxDriver(LinuxDriver):
    run_input_thread = _with_globals(LinuxDriver.run_input_thread, getincrementaldecoder=replacing_decoder,
                                     XTermParser=PasteSafeParser)


def terminal_driver(platform_driver: type[Driver]) -> type[Driver]:
    """The driver to run the TUI with, given the one Textual chose for this platform."""
    return LenientLinuxDriver if platform_driver is LinuxDriver else platform_driver
