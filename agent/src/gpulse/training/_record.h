/* What gpulse's two C modules share: the step record's layout, untracking plain tuples, and the heap
 * types' dealloc.
 *
 * _hotpath.c makes StepRecord objects on the training thread; _rows.c reads them on the worker's
 * thread (the rows of gpulse.training.plans), so both need the one struct. _rows finds the type
 * by importing gpulse.training._hotpath at load: without that module it does not load either.
 */
#ifndef GPULSE_RECORD_H
#define GPULSE_RECORD_H

#include <Python.h>

/* One finished step: PyStepRecord's fields (gpulse.training.step), as object members so that the
 * worker's reads specialise as they do for __slots__ (T_OBJECT_EX is what __slots__ makes). */
typedef struct {
    PyObject_HEAD
    PyObject *comm_ns, *gpu_pairs, *inflight_ns, *logs, *memory, *phases, *samples, *step, *tokens, *wait_ns;
    long long t0_ns, t1_ns; /* the clock's: ints made when read (on the worker's thread), not per step here */
} RecordObject;

/* the object fields (the two times are members of their own) */
#define RECORD_FIELDS(X) \
    X(comm_ns) X(gpu_pairs) X(inflight_ns) X(logs) X(memory) X(phases) X(samples) X(step) X(tokens) X(wait_ns)

/* Untrack a tuple that can be in no cycle (names and numbers: a step's phases, a row), by CPython's
 * own rule when a collection first looks at a tuple (Objects/tupleobject.c, _PyTuple_MaybeUntrack, with
 * _PyObject_GC_MAY_BE_TRACKED): no item may be tracked, and only an untracked exact tuple counts as
 * untracked for good (a dict or list may be tracked later). Done at once, no collection traverses the
 * tuple while it waits for the worker, the agent or the report. */
static inline void
untrack_plain(PyObject *tuple)
{
    Py_ssize_t i;
    for (i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyObject_IS_GC(item) && (!PyTuple_CheckExact(item) || PyObject_GC_IsTracked(item)))
            return;
    }
    PyObject_GC_UnTrack(tuple);
}

/* Every heap type's tp_dealloc: untrack, drop the references (its tp_clear), free, and release the
 * heap type (for a Python subclass too: subtype_dealloc leaves that to a heap base type). */
static inline void
dealloc_with(PyObject *self, inquiry clear)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

#endif
