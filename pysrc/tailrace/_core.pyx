# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: freethreading_compatible=False
"""tailrace._core: the compiled core of tailrace.

Assembled from fragments, one concern each (uvloop style):
  _status.pxi      the one error checker (C status -> exceptions in errors.py)
  _types.pxi       Envelope and Coordinator (made once per message, so compiled)
  _collector.pxi   Collector (send is called once per emitted message)
  _primitives.pxi  Python wrappers of the C queue, sequencer and watermark
  _loop.pxi        the C dispatch loop binding: trampolines, Callback, LoopRunner
  _serde_scan.pxi  tailrace.serdes' JSON codec and its guard scans (once per message)
  _filein.pxi      file inputs: find, decode and wrap each line of a chunk (once per message)
  _fileout.pxi     file outputs: encode and append to a partition's buffer (once per message)
  _windows.pxi     a tumbling window's add (tailrace.windows; once per message)
"""

cimport cython
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free

from tailrace cimport _capi as capi

include "_status.pxi"
include "_types.pxi"
include "_serde_scan.pxi"
include "_fileout.pxi"
include "_collector.pxi"
include "_primitives.pxi"
include "_aio.pxi"
include "_timestamps.pxi"
include "_loop.pxi"
include "_filein.pxi"
include "_kafkain.pxi"
include "_windows.pxi"
