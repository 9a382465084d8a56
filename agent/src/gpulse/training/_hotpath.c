/* gpulse.training._hotpath: the two things the user's loop calls most, in C.
 *
 *  - PhaseBase: the CPU phase timer's __enter__ and __exit__. `with run.phase(name):` runs three
 *    times a step, and in Python each use is two interpreter frames; in C the `with` statement
 *    calls both without one.
 *  - TimedIter: what `for batch in run.wrap_loader(loader)` iterates: each next() timed, the wait
 *    added to the step recorder's wait_ns, without resuming a generator's frame.
 *
 * Why: the training thread's overhead goal is <= 5 us a step on a 2-vCPU VM, where right after a
 * wait on the GPU every interpreter frame costs several times its hot figure (BENCHMARKS.md).
 * Each is the same logic as its Python reference in gpulse.training.step (PyPhaseBase,
 * py_timed_iter), line for line, and one test suite runs against both (test_hotpath.py). The build
 * is optional (agent/setup.py): without a C compiler gpulse uses the Python ones.
 *
 * The clock is CLOCK_MONOTONIC, which is what time.perf_counter_ns() reads on Linux
 * (Python/pytime.c, py_get_monotonic_clock); phases keep durations only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    PyObject *steps;  /* the StepRecorder: its in_step says whether a step is open */
    PyObject *name;   /* the phase's field name */
    PyObject *times;  /* steps.phase_times: the open step's (name, ns, ...) list */
    PyObject *ev0;    /* GpuPhase's start event (kept here so that both classes share one layout) */
    long long t0;     /* perf_counter_ns() at __enter__, 0 when not open */
} PhaseObject;

static PyObject *str_in_step;
static PyObject *str_phase_times;
static PyObject *str_wait_ns;

static inline long long
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
}

static PyObject *
not_initialised(void)
{
    PyErr_SetString(PyExc_RuntimeError, "PhaseBase.__init__(steps, name) was not called");
    return NULL;
}

static int
Phase_init(PhaseObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"steps", "name", NULL};
    PyObject *steps, *name, *times;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OU:Phase", kwlist, &steps, &name))
        return -1;
    times = PyObject_GetAttr(steps, str_phase_times);
    if (times == NULL)
        return -1;
    if (!PyList_CheckExact(times)) {
        PyErr_SetString(PyExc_TypeError, "steps.phase_times must be a list");
        Py_DECREF(times);
        return -1;
    }
    Py_INCREF(steps);
    Py_INCREF(name);
    Py_XSETREF(self->steps, steps);
    Py_XSETREF(self->name, name);
    Py_XSETREF(self->times, times);
    Py_INCREF(Py_None);
    Py_XSETREF(self->ev0, Py_None);
    self->t0 = 0;
    return 0;
}

/* if self.steps.in_step: self.t0 = perf_counter_ns() */
static PyObject *
Phase_enter(PhaseObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *open;
    int on;
    if (self->steps == NULL)
        return not_initialised();
    open = PyObject_GetAttr(self->steps, str_in_step);
    if (open == NULL)
        return NULL;
    on = open == Py_True ? 1 : (open == Py_False ? 0 : PyObject_IsTrue(open));
    Py_DECREF(open);
    if (on < 0)
        return NULL;
    if (on)
        self->t0 = now_ns();
    Py_INCREF(self);
    return (PyObject *)self;
}

/* if self.t0: self.times.extend((self.name, perf_counter_ns() - self.t0)); self.t0 = 0 */
static PyObject *
Phase_exit(PhaseObject *self, PyObject *const *Py_UNUSED(args), Py_ssize_t Py_UNUSED(nargs))
{
    long long t0 = self->t0;
    if (t0) {
        PyObject *ns;
        int failed;
        if (self->times == NULL)
            return not_initialised();
        ns = PyLong_FromLongLong(now_ns() - t0);
        if (ns == NULL)
            return NULL;
        self->t0 = 0;
        failed = PyList_Append(self->times, self->name) < 0 || PyList_Append(self->times, ns) < 0;
        Py_DECREF(ns);
        if (failed)
            return NULL;
    }
    Py_RETURN_NONE;
}

static int
Phase_traverse(PhaseObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->steps);
    Py_VISIT(self->name);
    Py_VISIT(self->times);
    Py_VISIT(self->ev0);
    return 0;
}

static int
Phase_clear(PhaseObject *self)
{
    Py_CLEAR(self->steps);
    Py_CLEAR(self->name);
    Py_CLEAR(self->times);
    Py_CLEAR(self->ev0);
    return 0;
}

/* Both types' tp_dealloc: untrack, drop the references (their tp_clear), free, and release the heap type
 * (for a Python subclass too: subtype_dealloc leaves that to a heap base type). */
static void
dealloc_with(PyObject *self, inquiry clear)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static void
Phase_dealloc(PyObject *self)
{
    dealloc_with(self, (inquiry)Phase_clear);
}

static PyMethodDef Phase_methods[] = {
    {"__enter__", (PyCFunction)Phase_enter, METH_NOARGS, "Start timing, if a step is open."},
    {"__exit__", (PyCFunction)(void (*)(void))Phase_exit, METH_FASTCALL,
     "Add the time since __enter__ to the open step's phases; never swallows an exception."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Phase_members[] = {
    {"steps", T_OBJECT_EX, offsetof(PhaseObject, steps), READONLY, "the StepRecorder"},
    {"name", T_OBJECT_EX, offsetof(PhaseObject, name), READONLY, "the phase's field name"},
    {"times", T_OBJECT_EX, offsetof(PhaseObject, times), READONLY, "the open step's phase list"},
    {"ev0", T_OBJECT, offsetof(PhaseObject, ev0), 0, "GpuPhase's start event, or None"},
    {"t0", T_LONGLONG, offsetof(PhaseObject, t0), 0, "perf_counter_ns() at __enter__, 0 when not open"},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Phase_slots[] = {
    {Py_tp_doc, "A phase timer's base: __enter__ and __exit__ in C (gpulse.training.step.Phase)."},
    {Py_tp_init, Phase_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Phase_dealloc},
    {Py_tp_traverse, Phase_traverse},
    {Py_tp_clear, Phase_clear},
    {Py_tp_methods, Phase_methods},
    {Py_tp_members, Phase_members},
    {0, NULL},
};

/* A heap type, so that Python subclasses of it can swap __class__ (Phase -> GpuPhase). */
static PyType_Spec Phase_spec = {
    .name = "gpulse.training._hotpath.PhaseBase",
    .basicsize = sizeof(PhaseObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Phase_slots,
};

/* -- TimedIter ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *steps;  /* the StepRecorder: wait_ns gets each next()'s wait */
    PyObject *it;     /* iter(loader) */
} TimedIterObject;

static PyObject *
TimedIter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *steps, *loader, *it;
    TimedIterObject *self;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "TimedIter(steps, loader) takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "TimedIter", 2, 2, &steps, &loader))
        return NULL;
    it = PyObject_GetIter(loader);
    if (it == NULL)
        return NULL;
    self = (TimedIterObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    Py_INCREF(steps);
    self->steps = steps;
    self->it = it;
    return (PyObject *)self;
}

/* t0 = clock(); batch = next(it) (StopIteration ends); steps.wait_ns += clock() - t0; return batch */
static PyObject *
TimedIter_next(TimedIterObject *self)
{
    long long t0 = now_ns();
    PyObject *batch = (*Py_TYPE(self->it)->tp_iternext)(self->it);
    PyObject *ns, *wait, *sum;
    if (batch == NULL)
        return NULL; /* the end (StopIteration, or none set) or the loader's own error, passed on */
    ns = PyLong_FromLongLong(now_ns() - t0);
    if (ns == NULL)
        goto fail;
    wait = PyObject_GetAttr(self->steps, str_wait_ns);
    if (wait == NULL) {
        Py_DECREF(ns);
        goto fail;
    }
    sum = PyNumber_Add(wait, ns);
    Py_DECREF(wait);
    Py_DECREF(ns);
    if (sum == NULL || PyObject_SetAttr(self->steps, str_wait_ns, sum) < 0) {
        Py_XDECREF(sum);
        goto fail;
    }
    Py_DECREF(sum);
    return batch;
fail:
    Py_DECREF(batch);
    return NULL;
}

static int
TimedIter_traverse(TimedIterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->steps);
    Py_VISIT(self->it);
    return 0;
}

static int
TimedIter_clear(TimedIterObject *self)
{
    Py_CLEAR(self->steps);
    Py_CLEAR(self->it);
    return 0;
}

static void
TimedIter_dealloc(PyObject *self)
{
    dealloc_with(self, (inquiry)TimedIter_clear);
}

static PyType_Slot TimedIter_slots[] = {
    {Py_tp_doc, "iter(loader), each next() timed into steps.wait_ns (gpulse.training.step.TimedLoader)."},
    {Py_tp_new, TimedIter_new},
    {Py_tp_iter, PyObject_SelfIter},
    {Py_tp_iternext, TimedIter_next},
    {Py_tp_dealloc, TimedIter_dealloc},
    {Py_tp_traverse, TimedIter_traverse},
    {Py_tp_clear, TimedIter_clear},
    {0, NULL},
};

static PyType_Spec TimedIter_spec = {
    .name = "gpulse.training._hotpath.TimedIter",
    .basicsize = sizeof(TimedIterObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = TimedIter_slots,
};

/* -- the module -------------------------------------------------------------------------------- */

static int
add_type(PyObject *module, const char *name, PyType_Spec *spec)
{
    PyObject *type = PyType_FromSpec(spec);
    if (type == NULL)
        return -1;
    if (PyModule_AddObject(module, name, type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int
hotpath_exec(PyObject *module)
{
    str_in_step = PyUnicode_InternFromString("in_step");
    str_phase_times = PyUnicode_InternFromString("phase_times");
    str_wait_ns = PyUnicode_InternFromString("wait_ns");
    if (str_in_step == NULL || str_phase_times == NULL || str_wait_ns == NULL)
        return -1;
    if (add_type(module, "PhaseBase", &Phase_spec) < 0 || add_type(module, "TimedIter", &TimedIter_spec) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot hotpath_module_slots[] = {
    {Py_mod_exec, hotpath_exec},
    {0, NULL},
};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpulse.training._hotpath",
    .m_doc = "The phase timer and the timed loader iterator in C (see gpulse.training.step).",
    .m_size = 0,
    .m_slots = hotpath_module_slots,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    return PyModuleDef_Init(&hotpath_module);
}
