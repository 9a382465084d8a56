/* gpulse.training._hotpath: what the user's loop runs every step, in C.
 *
 *  - StepBase: the step recorder's state and its hot methods: `run.step(...)` (prepare), the
 *    step's __enter__ and __exit__, hand_over (the finished step into the worker's queue) and
 *    `run.log(...)` (log). gpulse.training.step.StepRecorder is its Python subclass: what only
 *    integrations and CUDA runs need (hooks, events, memory) stays there, called from here only
 *    when the recorder's `extras` flag says so.
 *  - StepRecord: one finished step, made by __exit__ without an interpreter frame.
 *  - PhaseBase: the CPU phase timer's __enter__ and __exit__ (`with run.phase(name):`).
 *  - TimedIter: what `for batch in run.wrap_loader(loader)` iterates: each next() timed, the wait
 *    added to the recorder's wait_ns.
 *
 * Why: the training thread's overhead goal is <= 5 us a step on a 2-vCPU VM. Right after the wait
 * on the GPU (here, the benchmark's 1 ms sleep) everything the step touches is cold: on such a VM
 * the same code costs 5x its hot figure there, in proportion to the memory and code it touches
 * (BENCHMARKS.md). An interpreter frame, a generic attribute lookup or a keyword dict touches far
 * more than a C function reading its own struct, so the state lives in the struct and the other
 * types read it directly when the recorder is a StepBase.
 * Each is the same logic as its Python reference in gpulse.training.step (PyStepBase,
 * PyStepRecord, PyPhaseBase, py_timed_iter), line for line, and one test suite runs against both
 * (test_hotpath.py). The build is optional (agent/setup.py): without a C compiler gpulse uses the
 * Python ones.
 *
 * The clock is CLOCK_MONOTONIC, which is what time.perf_counter_ns() reads on Linux
 * (Python/pytime.c, py_get_monotonic_clock); phases keep durations only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#include "_record.h" /* StepRecord's struct, dealloc_with */

/* The step recorder's hot state (gpulse.training.step.PyStepBase has the same attributes). */
typedef struct {
    PyObject_HEAD
    PyObject *queue;        /* the worker's deque of StepRecords (and points) */
    PyObject *queue_append; /* queue.append, bound once */
    PyObject *last;         /* the finished step not yet handed over, or NULL */
    PyObject *logs;         /* run.log()'s scalars since the last hand-over (a dict) */
    PyObject *step_samples; /* the counts run.step() was given for the open step */
    PyObject *step_tokens;
    PyObject *step_number;
    PyObject *phase_times;  /* the open step's phases, flat: name, ns, name, ns, ... */
    long long t0;           /* perf_counter_ns() at the step's start */
    long long step_no;      /* the last step's number */
    long long wait_ns;      /* data wait since the last step's end */
    long long next_cuda_check;
    Py_ssize_t max_queue;
    Py_ssize_t not_kept;    /* steps the full queue could not take */
    char in_step;
    char wait_known;        /* set for good by the timed loader or add_data_wait */
    char extras;            /* steps carry more than times, counts and logs: the subclass's hooks run */
} StepObject;

static PyTypeObject *StepType;   /* StepBase: PhaseBase and TimedIter read its struct directly */
static PyTypeObject *RecordType; /* StepRecord */

typedef struct {
    PyObject_HEAD
    PyObject *steps;  /* the StepRecorder: its in_step says whether a step is open */
    PyObject *name;   /* the phase's field name */
    PyObject *times;  /* steps.phase_times: the open step's (name, ns, ...) list */
    PyObject *ev0;    /* GpuPhase's start event (kept here so that both classes share one layout) */
    long long t0;     /* perf_counter_ns() at __enter__, 0 when not open */
    StepObject *core; /* steps, where it is a StepBase (read directly), else NULL (steps is held above) */
} PhaseObject;

static PyObject *str_in_step;
static PyObject *str_phase_times;
static PyObject *str_wait_ns;
static PyObject *str_logs;
static PyObject *str_samples;
static PyObject *str_tokens;
static PyObject *str_step;
static PyObject *str_append;
static PyObject *str_check_cuda;
static PyObject *str_enter_extras;
static PyObject *str_closing;
static PyObject *str_add_extras;
static PyObject *str_logs_handed;
static PyObject *str_queue_full;
static PyObject *str_step_raised;
static PyObject *deque_type;

/* steps as a StepBase, whose struct the phase or the loader then reads directly, or NULL */
#define CORE_OF(o) (PyObject_TypeCheck((o), StepType) ? (StepObject *)(o) : NULL)

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
    self->core = CORE_OF(steps);
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
    if (self->core != NULL) {
        if (self->core->in_step)
            self->t0 = now_ns();
        Py_INCREF(self);
        return (PyObject *)self;
    }
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
    self->core = NULL;
    Py_CLEAR(self->steps);
    Py_CLEAR(self->name);
    Py_CLEAR(self->times);
    Py_CLEAR(self->ev0);
    return 0;
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
    StepObject *core; /* steps, where it is a StepBase, else NULL */
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
    self->core = CORE_OF(steps);
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
    if (self->core != NULL) {
        self->core->wait_ns += now_ns() - t0;
        return batch;
    }
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
    self->core = NULL;
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

/* -- StepRecord -------------------------------------------------------------------------------- */

static PyObject *
Record_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"step", "t0_ns", "t1_ns", "wait_ns", "samples", "tokens", "phases",
                             "gpu_pairs", "memory", "comm_ns", "inflight_ns", NULL};
    PyObject *v[11];
    long long t0, t1;
    RecordObject *self;
    int i;
    v[10] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OLLOOOOOOO|O:StepRecord", kwlist, &v[0], &t0, &t1,
                                     &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &v[10]))
        return NULL;
    self = (RecordObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    Py_INCREF(v[0]);
    for (i = 3; i < 11; i++)
        Py_INCREF(v[i]);
    self->step = v[0], self->t0_ns = t0, self->t1_ns = t1, self->wait_ns = v[3];
    self->samples = v[4], self->tokens = v[5], self->phases = v[6], self->gpu_pairs = v[7];
    self->memory = v[8], self->comm_ns = v[9], self->inflight_ns = v[10];
    Py_INCREF(Py_None);
    self->logs = Py_None;
    return (PyObject *)self;
}

/* Untrack a record that refers to no tracked object: a plain step's record (ints, a tuple of names
 * and ints, a dict of floats) is then neither traversed by each collection while it waits in the queue
 * (a second's steps) nor, surviving two, promoted to the oldest generation, whose growth brings on full
 * collections, tens of ms each with torch's objects in the heap (BENCHMARKS.md). A record whose step
 * logged a container stays tracked, and one given a tracked value later is tracked again
 * (Record_setattro).
 * Unlike untrack_plain (CPython's rule), this trusts the present state of the record's dicts (logs,
 * memory), which CPython would count as "may be tracked later": a logged step's dict of floats would
 * otherwise keep every such record tracked. That holds because nothing adds to a record's dicts once it
 * is handed over: the CUDA hook's copies (cuda.py, copy_logs) are in before this runs, and the worker
 * only deletes from them (worker.py, the steps whose copies did not complete). */
static void
maybe_untrack(RecordObject *rec)
{
#define TRACKED(f) if (rec->f != NULL && PyObject_GC_IsTracked(rec->f)) return;
    RECORD_FIELDS(TRACKED)
#undef TRACKED
    PyObject_GC_UnTrack(rec);
}

/* rec.<field> = value: a tracked value makes an untracked record tracked again (maybe_untrack) */
static int
Record_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    if (PyObject_GenericSetAttr(self, name, value) < 0)
        return -1;
    if (value != NULL && !PyObject_GC_IsTracked(self) && PyObject_GC_IsTracked(value))
        PyObject_GC_Track(self);
    return 0;
}

/* What StepBase.__exit__ makes: steals step, wait and phases (new references, any may be NULL after
 * a failed allocation: then all are released and NULL returned). */
static PyObject *
record_make(PyObject *step, long long t0, long long t1, PyObject *wait, PyObject *samples,
            PyObject *tokens, PyObject *phases)
{
    RecordObject *rec = NULL;
    if (step != NULL && wait != NULL && phases != NULL)
        rec = (RecordObject *)RecordType->tp_alloc(RecordType, 0);
    if (rec == NULL) {
        Py_XDECREF(step), Py_XDECREF(wait), Py_XDECREF(phases);
        return NULL;
    }
    rec->step = step, rec->t0_ns = t0, rec->t1_ns = t1, rec->wait_ns = wait, rec->phases = phases;
    Py_INCREF(samples), Py_INCREF(tokens);
    rec->samples = samples, rec->tokens = tokens;
    Py_INCREF(Py_None), Py_INCREF(Py_None), Py_INCREF(Py_None), Py_INCREF(Py_None), Py_INCREF(Py_None);
    rec->gpu_pairs = rec->memory = rec->comm_ns = rec->inflight_ns = rec->logs = Py_None;
    return (PyObject *)rec;
}

static int
Record_traverse(RecordObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
#define VISIT(f) Py_VISIT(self->f);
    RECORD_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int
Record_clear(RecordObject *self)
{
#define CLEAR(f) Py_CLEAR(self->f);
    RECORD_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void
Record_dealloc(PyObject *self)
{
    dealloc_with(self, (inquiry)Record_clear);
}

static PyMemberDef Record_members[] = {
#define MEMBER(f) {#f, T_OBJECT_EX, offsetof(RecordObject, f), 0, NULL},
    RECORD_FIELDS(MEMBER)
#undef MEMBER
    {"t0_ns", T_LONGLONG, offsetof(RecordObject, t0_ns), 0, NULL},
    {"t1_ns", T_LONGLONG, offsetof(RecordObject, t1_ns), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Record_slots[] = {
    {Py_tp_doc, "One finished step (gpulse.training.step.PyStepRecord, in C)."},
    {Py_tp_new, Record_new},
    {Py_tp_dealloc, Record_dealloc},
    {Py_tp_setattro, Record_setattro},
    {Py_tp_traverse, Record_traverse},
    {Py_tp_clear, Record_clear},
    {Py_tp_members, Record_members},
    {0, NULL},
};

static PyType_Spec Record_spec = {
    .name = "gpulse.training._hotpath.StepRecord",
    .basicsize = sizeof(RecordObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Record_slots,
};

/* -- StepBase ---------------------------------------------------------------------------------- */

/* self.<name>() of the Python subclass (a hook); -1 on error */
static int
call_hook(PyObject *self, PyObject *name, PyObject *arg)
{
    PyObject *r = arg == NULL ? PyObject_CallMethodNoArgs(self, name) : PyObject_CallMethodOneArg(self, name, arg);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
Step_init(StepObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_queue", NULL};
    Py_ssize_t max_queue;
    PyObject *queue, *append, *logs, *times;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n:StepBase", kwlist, &max_queue))
        return -1;
    queue = PyObject_CallNoArgs(deque_type);
    append = queue == NULL ? NULL : PyObject_GetAttr(queue, str_append);
    logs = PyDict_New();
    times = PyList_New(0);
    if (queue == NULL || append == NULL || logs == NULL || times == NULL) {
        Py_XDECREF(queue), Py_XDECREF(append), Py_XDECREF(logs), Py_XDECREF(times);
        return -1;
    }
    Py_XSETREF(self->queue, queue);
    Py_XSETREF(self->queue_append, append);
    Py_XSETREF(self->logs, logs);
    Py_XSETREF(self->phase_times, times);
    Py_CLEAR(self->last);
    Py_CLEAR(self->step_samples);
    Py_CLEAR(self->step_tokens);
    Py_CLEAR(self->step_number);
    self->max_queue = max_queue;
    self->not_kept = 0;
    self->t0 = self->step_no = self->wait_ns = self->next_cuda_check = 0;
    self->in_step = self->wait_known = self->extras = 0;
    return 0;
}

static int
not_ready(StepObject *self)
{
    if (self->queue_append != NULL)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "StepBase.__init__(max_queue) was not called");
    return -1;
}

#define IS_NONE(o) ((o) == NULL || (o) == Py_None)

/* run.step(samples=None, tokens=None, step=None): the open step's counts; returns the recorder */
static PyObject *
Step_prepare(StepObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *v[3] = {Py_None, Py_None, Py_None};
    PyObject *names[3] = {str_samples, str_tokens, str_step};
    Py_ssize_t i, nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 3) {
        PyErr_Format(PyExc_TypeError, "step() takes at most 3 arguments (%zd given)", nargs);
        return NULL;
    }
    for (i = 0; i < nargs; i++)
        v[i] = args[i];
    for (i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        int k;
        for (k = 0; k < 3; k++)
            if (key == names[k] || PyUnicode_Compare(key, names[k]) == 0)
                break;
        if (k == 3 || k < nargs) {
            PyErr_Format(PyExc_TypeError, k == 3 ? "step() got an unexpected keyword argument '%U'"
                                                 : "step() got multiple values for argument '%U'", key);
            return NULL;
        }
        v[k] = args[nargs + i];
    }
    Py_INCREF(v[0]), Py_INCREF(v[1]), Py_INCREF(v[2]);
    Py_XSETREF(self->step_samples, v[0]);
    Py_XSETREF(self->step_tokens, v[1]);
    Py_XSETREF(self->step_number, v[2]);
    Py_INCREF(self);
    return (PyObject *)self;
}

/* run.log(**scalars): into the step's logs dict (handed over with the step) */
static PyObject *
Step_log(StepObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t i, nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs) {
        PyErr_SetString(PyExc_TypeError, "log() takes keyword arguments only: run.log(loss=...)");
        return NULL;
    }
    if (nkw && !PyDict_CheckExact(self->logs)) {
        PyObject *fresh = PyDict_New(); /* Python code may have left something else there */
        if (fresh == NULL)
            return NULL;
        Py_XSETREF(self->logs, fresh);
    }
    for (i = 0; i < nkw; i++)
        if (PyDict_SetItem(self->logs, PyTuple_GET_ITEM(kwnames, i), args[i]) < 0)
            return NULL;
    Py_RETURN_NONE;
}

/* The finished step into the queue, with its logs (at the next step's start, or at finish). */
static PyObject *
Step_hand_over(StepObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *rec = self->last, *logs = self->logs, *r;
    Py_ssize_t n;
    if (IS_NONE(rec))
        Py_RETURN_NONE;
    if (not_ready(self) < 0)
        return NULL;
    self->last = NULL; /* its reference is rec's now */
    if (logs != NULL && PyObject_IsTrue(logs) > 0) {
        PyObject *fresh = PyDict_New();
        int failed = fresh == NULL;
        if (!failed && Py_IS_TYPE(rec, RecordType)) {
            Py_INCREF(logs);
            Py_SETREF(((RecordObject *)rec)->logs, logs);
        }
        else if (!failed)
            failed = PyObject_SetAttr(rec, str_logs, logs) < 0;
        if (failed) {
            Py_XDECREF(fresh);
            Py_DECREF(rec);
            return NULL;
        }
        Py_INCREF(logs);
        Py_SETREF(self->logs, fresh);
        failed = self->extras && call_hook((PyObject *)self, str_logs_handed, logs) < 0;
        Py_DECREF(logs);
        if (failed) {
            Py_DECREF(rec);
            return NULL;
        }
    }
    n = PyObject_Size(self->queue);
    if (n < 0 || n >= self->max_queue) {
        Py_DECREF(rec);
        if (n < 0)
            return NULL;
        self->not_kept += 1;
        if (self->not_kept == 1 && call_hook((PyObject *)self, str_queue_full, NULL) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (Py_IS_TYPE(rec, RecordType) && PyObject_GC_IsTracked(rec))
        maybe_untrack((RecordObject *)rec); /* its logs and the hooks' additions are in by now */
    r = PyObject_CallOneArg(self->queue_append, rec);
    Py_DECREF(rec);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
}

static PyObject *
Step_enter(StepObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!IS_NONE(self->last)) {
        PyObject *r = Step_hand_over(self, NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    if (self->step_no >= self->next_cuda_check && call_hook((PyObject *)self, str_check_cuda, NULL) < 0)
        return NULL;
    if (self->extras && call_hook((PyObject *)self, str_enter_extras, NULL) < 0)
        return NULL;
    self->in_step = 1;
    self->t0 = now_ns();
    Py_INCREF(self);
    return (PyObject *)self;
}

/* End the step: its record becomes `last`. A step that raised is forgotten (the subclass's
 * _step_raised) and the exception goes on to the loop. */
static PyObject *
Step_exit(StepObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long t1 = now_ns();
    PyObject *step, *phases, *wait, *rec;
    Py_ssize_t n;
    int extras;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "__exit__ takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (args[0] != Py_None) {
        PyObject *r = PyObject_CallMethodObjArgs((PyObject *)self, str_step_raised, args[0], args[1], NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    if (!self->in_step)
        Py_RETURN_NONE;
    if (not_ready(self) < 0)
        return NULL;
    extras = self->extras;
    if (extras && call_hook((PyObject *)self, str_closing, NULL) < 0)
        return NULL;
    self->in_step = 0;
    if (IS_NONE(self->step_number)) {
        self->step_no += 1;
        step = PyLong_FromLongLong(self->step_no);
    }
    else { /* the record keeps what it was given (the worker checks it); step_no follows an int64 */
        long long given = 0;
        int overflow = 1;
        if (PyLong_Check(self->step_number))
            given = PyLong_AsLongLongAndOverflow(self->step_number, &overflow);
        self->step_no = overflow ? self->step_no + 1 : given;
        step = self->step_number;
        Py_INCREF(step);
    }
    n = PyList_GET_SIZE(self->phase_times);
    phases = PyTuple_New(n);
    if (phases == NULL)
        return NULL;
    if (n) { /* the list's references move to the tuple; the list keeps its room for the next step */
        PyListObject *times = (PyListObject *)self->phase_times;
        memcpy(((PyTupleObject *)phases)->ob_item, times->ob_item, n * sizeof(PyObject *));
        Py_SET_SIZE(times, 0);
        untrack_plain(phases);
    }
    if (self->wait_known) {
        wait = PyLong_FromLongLong(self->wait_ns);
        self->wait_ns = 0;
    }
    else {
        Py_INCREF(Py_None);
        wait = Py_None;
    }
    rec = record_make(step, self->t0, t1, wait, IS_NONE(self->step_samples) ? Py_None : self->step_samples,
                      IS_NONE(self->step_tokens) ? Py_None : self->step_tokens, phases);
    if (rec == NULL)
        return NULL;
    Py_XSETREF(self->last, rec);
    if (extras && call_hook((PyObject *)self, str_add_extras, rec) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
Step_traverse(StepObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->queue);
    Py_VISIT(self->queue_append);
    Py_VISIT(self->last);
    Py_VISIT(self->logs);
    Py_VISIT(self->step_samples);
    Py_VISIT(self->step_tokens);
    Py_VISIT(self->step_number);
    Py_VISIT(self->phase_times);
    return 0;
}

static int
Step_clear(StepObject *self)
{
    Py_CLEAR(self->queue);
    Py_CLEAR(self->queue_append);
    Py_CLEAR(self->last);
    Py_CLEAR(self->logs);
    Py_CLEAR(self->step_samples);
    Py_CLEAR(self->step_tokens);
    Py_CLEAR(self->step_number);
    Py_CLEAR(self->phase_times);
    return 0;
}

/* A Python subclass (StepRecorder) has a __dict__: subtype_dealloc clears it, then calls this. */
static void
Step_dealloc(PyObject *self)
{
    dealloc_with(self, (inquiry)Step_clear);
}

static PyMethodDef Step_methods[] = {
    {"prepare", (PyCFunction)(void (*)(void))Step_prepare, METH_FASTCALL | METH_KEYWORDS,
     "prepare(samples=None, tokens=None, step=None): the next step's counts; returns the recorder."},
    {"log", (PyCFunction)(void (*)(void))Step_log, METH_FASTCALL | METH_KEYWORDS,
     "log(**scalars): scalars for the current (or just finished) step."},
    {"hand_over", (PyCFunction)Step_hand_over, METH_NOARGS, "Queue the finished step with its logs."},
    {"__enter__", (PyCFunction)Step_enter, METH_NOARGS, "Start a step (handing the last one over)."},
    {"__exit__", (PyCFunction)(void (*)(void))Step_exit, METH_FASTCALL,
     "End the step; a step that raised is forgotten and the exception goes on."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Step_members[] = {
    {"queue", T_OBJECT_EX, offsetof(StepObject, queue), READONLY, "the worker's queue"},
    {"last", T_OBJECT, offsetof(StepObject, last), 0, "the finished step not yet handed over"},
    {"logs", T_OBJECT_EX, offsetof(StepObject, logs), 0, "run.log()'s scalars since the last hand-over"},
    {"step_samples", T_OBJECT, offsetof(StepObject, step_samples), 0, NULL},
    {"step_tokens", T_OBJECT, offsetof(StepObject, step_tokens), 0, NULL},
    {"step_number", T_OBJECT, offsetof(StepObject, step_number), 0, NULL},
    {"phase_times", T_OBJECT_EX, offsetof(StepObject, phase_times), READONLY, "the open step's phases"},
    {"t0", T_LONGLONG, offsetof(StepObject, t0), 0, NULL},
    {"step_no", T_LONGLONG, offsetof(StepObject, step_no), 0, NULL},
    {"wait_ns", T_LONGLONG, offsetof(StepObject, wait_ns), 0, NULL},
    {"_next_cuda_check", T_LONGLONG, offsetof(StepObject, next_cuda_check), 0, NULL},
    {"max_queue", T_PYSSIZET, offsetof(StepObject, max_queue), 0, NULL},
    {"not_kept", T_PYSSIZET, offsetof(StepObject, not_kept), 0, NULL},
    {"in_step", T_BOOL, offsetof(StepObject, in_step), 0, NULL},
    {"wait_known", T_BOOL, offsetof(StepObject, wait_known), 0, NULL},
    {"extras", T_BOOL, offsetof(StepObject, extras), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot Step_slots[] = {
    {Py_tp_doc, "The step recorder's hot state and methods (gpulse.training.step.PyStepBase, in C)."},
    {Py_tp_init, Step_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Step_dealloc},
    {Py_tp_traverse, Step_traverse},
    {Py_tp_clear, Step_clear},
    {Py_tp_methods, Step_methods},
    {Py_tp_members, Step_members},
    {0, NULL},
};

static PyType_Spec Step_spec = {
    .name = "gpulse.training._hotpath.StepBase",
    .basicsize = sizeof(StepObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Step_slots,
};

/* -- the module -------------------------------------------------------------------------------- */

static PyObject *
add_type(PyObject *module, const char *name, PyType_Spec *spec)
{
    PyObject *type = PyType_FromSpec(spec);
    if (type == NULL)
        return NULL;
    if (PyModule_AddObject(module, name, type) < 0) {
        Py_DECREF(type);
        return NULL;
    }
    return type; /* borrowed: the module holds it */
}

static int
hotpath_exec(PyObject *module)
{
    PyObject *collections;
#define INTERN(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1;
    INTERN(str_in_step, "in_step")
    INTERN(str_phase_times, "phase_times")
    INTERN(str_wait_ns, "wait_ns")
    INTERN(str_logs, "logs")
    INTERN(str_samples, "samples")
    INTERN(str_tokens, "tokens")
    INTERN(str_step, "step")
    INTERN(str_append, "append")
    INTERN(str_check_cuda, "check_cuda")
    INTERN(str_enter_extras, "_enter_extras")
    INTERN(str_closing, "_closing")
    INTERN(str_add_extras, "_add_extras")
    INTERN(str_logs_handed, "_logs_handed")
    INTERN(str_queue_full, "_queue_full")
    INTERN(str_step_raised, "_step_raised")
#undef INTERN
    collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return -1;
    deque_type = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL)
        return -1;
    if ((StepType = (PyTypeObject *)add_type(module, "StepBase", &Step_spec)) == NULL
        || (RecordType = (PyTypeObject *)add_type(module, "StepRecord", &Record_spec)) == NULL
        || add_type(module, "PhaseBase", &Phase_spec) == NULL || add_type(module, "TimedIter", &TimedIter_spec) == NULL)
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
    .m_doc = "The step recorder, its record, the phase timer and the timed loader in C (see gpulse.training.step).",
    .m_size = 0,
    .m_slots = hotpath_module_slots,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    return PyModuleDef_Init(&hotpath_module);
}
