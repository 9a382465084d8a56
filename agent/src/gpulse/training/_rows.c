/* gpulse.training._rows: the worker's step rows in C (RowPlan; gpulse.training.plans has its reference).
 *
 * RowPlan(layout, mfu) is the plan of one Layout (gpulse/training/plans.py):
 *  - plan(rec, off): the row of one StepRecord, or None where the record does not have the layout
 *    with plain values only. The checks and the row are those of the Python function compile_plan
 *    writes, in its order; where this code is stricter (a record made in Python, a name that is not
 *    an exact str, a count of a subclass of int, a sum past int64), it says None and the worker's
 *    general path makes the row, so it can miss a case but never give another row.
 *  - plan.take(queue, n, off): the rows of the records at the head of the deque that it fits, at
 *    most n, taken off the deque; it stops at the first item that is not a StepRecord without GPU
 *    events or that it does not fit, and leaves that one there for the worker's general path.
 *
 * Why: the run's background thread has a goal of <= 5 us of CPU per step on a 2-vCPU VM
 * (BENCHMARKS.md), and the Python plan with the worker's loop around it cost about 1.5 us a step
 * hot there, several times that in the benchmark's loop: an interpreter frame, attribute reads that
 * make ints of the record's times, and the loop's own bytecodes. Here a record is read from its
 * struct and its row is built without a frame.
 * StepRecord is gpulse.training._hotpath's (imported at load: the struct is _record.h's); without
 * that module this one does not load either, and plans uses its Python reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#include "_record.h"

static PyTypeObject *RecordType; /* gpulse.training._hotpath.StepRecord */
static PyObject *str_popleft;
static PyObject *str_fixed;
static PyObject *str_model;

typedef struct {
    PyObject_HEAD
    PyObject *phases; /* the layout's phase names: a tuple of str */
    PyObject *logs;   /* the layout's logged names: a tuple of str */
    PyObject *mfu;    /* the run's Mfu: while it can compute FLOPs, steps with tokens take the general path */
    char wait, comm, inflight, samples, tokens, memory;
    Py_ssize_t width; /* the row's length, the timestamp included */
} PlanObject;

/* A layout's flag: layout.<name> as a truth value (-1 on error). */
static int
layout_flag(PyObject *layout, const char *name, char *flag)
{
    PyObject *v = PyObject_GetAttrString(layout, name);
    int on;
    if (v == NULL)
        return -1;
    on = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (on < 0)
        return -1;
    *flag = (char)on;
    return 0;
}

/* layout.<name> as a tuple of str, a new reference (NULL on error). */
static PyObject *
layout_names(PyObject *layout, const char *name)
{
    PyObject *v = PyObject_GetAttrString(layout, name);
    Py_ssize_t i;
    if (v == NULL)
        return NULL;
    if (!PyTuple_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "layout.%s must be a tuple", name);
        Py_DECREF(v);
        return NULL;
    }
    for (i = 0; i < PyTuple_GET_SIZE(v); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(v, i))) {
            PyErr_Format(PyExc_TypeError, "layout.%s must hold str", name);
            Py_DECREF(v);
            return NULL;
        }
    return v;
}

static PyObject *
Plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"layout", "mfu", NULL};
    PyObject *layout, *mfu, *phases, *logs;
    PlanObject *self;
    char flags[6];
    const char *names[6] = {"wait", "comm", "inflight", "samples", "tokens", "memory"};
    int i;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:RowPlan", kwlist, &layout, &mfu))
        return NULL;
    for (i = 0; i < 6; i++)
        if (layout_flag(layout, names[i], &flags[i]) < 0)
            return NULL;
    if ((phases = layout_names(layout, "phases")) == NULL)
        return NULL;
    if ((logs = layout_names(layout, "logs")) == NULL) {
        Py_DECREF(phases);
        return NULL;
    }
    self = (PlanObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(phases), Py_DECREF(logs);
        return NULL;
    }
    Py_INCREF(mfu);
    self->phases = phases, self->logs = logs, self->mfu = mfu;
    self->wait = flags[0], self->comm = flags[1], self->inflight = flags[2];
    self->samples = flags[3], self->tokens = flags[4], self->memory = flags[5];
    self->width = 4 + self->wait + PyTuple_GET_SIZE(phases) + self->comm + self->inflight + 2 * self->samples
                  + 2 * self->tokens + 4 * self->memory + PyTuple_GET_SIZE(logs) + 1;
    return (PyObject *)self;
}

/* a == b for the names of phases and logs: the same object, or two exact str that are equal */
static int
same_name(PyObject *a, PyObject *b)
{
    return a == b || (PyUnicode_CheckExact(a) && PyUnicode_CheckExact(b) && PyUnicode_Compare(a, b) == 0);
}

/* type(v) is int, for v possibly NULL (a deleted member) */
#define EXACT_INT(v) ((v) != NULL && PyLong_CheckExact(v))

/* type(v) is int and MIN <= v <= MAX (int64), with its value in *out */
static int
int64_of(PyObject *v, long long *out)
{
    int overflow = 0;
    if (!EXACT_INT(v))
        return 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow); /* cannot fail on an exact int */
    return !overflow;
}

/* A count the layout has: `type(v) is not int or not v or not MIN <= v <= MAX` means None. */
static int
present_count(PyObject *v)
{
    long long n;
    return int64_of(v, &n) && n != 0;
}

/* A count the layout lacks, `if rec.<count>: return None`: None, False and 0 fit; any other value is
 * left to the general path (a falsy value of another type too: stricter, never another row). */
static int
absent_count(PyObject *v)
{
    long long n;
    return v == Py_None || v == Py_False || (int64_of(v, &n) && n == 0);
}

/* `if mfu.fixed or mfu.model is not None: return None`: 1 when the plan fits, 0 when not, -1 on error */
static int
mfu_idle(PyObject *mfu)
{
    PyObject *v = PyObject_GetAttr(mfu, str_fixed);
    int on;
    if (v == NULL)
        return -1;
    on = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (on != 0)
        return on < 0 ? -1 : 0;
    if ((v = PyObject_GetAttr(mfu, str_model)) == NULL)
        return -1;
    on = v == Py_None;
    Py_DECREF(v);
    return on;
}

#define PUT(o)                            \
    do {                                  \
        PyObject *v_ = (o);               \
        if (v_ == NULL)                   \
            goto fail;                    \
        PyTuple_SET_ITEM(row, k++, v_);   \
    } while (0)
#define PUT_REF(o)                        \
    do {                                  \
        Py_INCREF(o);                     \
        PyTuple_SET_ITEM(row, k++, (o));  \
    } while (0)

/* The row of `obj` with `off` added to its times, or NULL: with an exception set on an error, without
 * one where the record does not fit (the plan's None). */
static PyObject *
plan_row(PlanObject *p, PyObject *obj, long long off)
{
    RecordObject *rec;
    PyObject *ph, *lg = NULL, *row, *end_ns;
    long long step, t0, t1, dur, start, end;
    Py_ssize_t nph = PyTuple_GET_SIZE(p->phases), nlogs = PyTuple_GET_SIZE(p->logs), i, k = 0, pos = 0;
    double dt = 0.0;
    if (!Py_IS_TYPE(obj, RecordType))
        return NULL;
    rec = (RecordObject *)obj;
    /* step = rec.step; if type(step) is not int or not MIN <= step <= MAX: return None */
    if (!int64_of(rec->step, &step))
        return NULL;
    t0 = rec->t0_ns, t1 = rec->t1_ns;
    /* t0 + off, t1 + off, t1 - t0: exact in Python; past int64 the general path makes them */
    if (__builtin_add_overflow(t0, off, &start) || __builtin_add_overflow(t1, off, &end)
        || __builtin_sub_overflow(t1, t0, &dur))
        return NULL;
    if (p->wait ? !EXACT_INT(rec->wait_ns) : rec->wait_ns != Py_None)
        return NULL;
    ph = rec->phases;
    if (ph == NULL || !PyTuple_CheckExact(ph) || PyTuple_GET_SIZE(ph) != 2 * nph)
        return NULL;
    for (i = 0; i < nph; i++)
        if (!same_name(PyTuple_GET_ITEM(ph, 2 * i), PyTuple_GET_ITEM(p->phases, i)))
            return NULL;
    if (p->comm ? !EXACT_INT(rec->comm_ns) : rec->comm_ns != Py_None)
        return NULL;
    if (p->inflight ? !EXACT_INT(rec->inflight_ns) : rec->inflight_ns != Py_None)
        return NULL;
    if (p->samples || p->tokens) {
        dt = (double)dur / 1e9; /* (t1 - t0) / 1e9: Python rounds the int to the nearest double too */
        if (dt <= 0)
            return NULL;
    }
    if (p->samples ? !present_count(rec->samples) : !absent_count(rec->samples))
        return NULL;
    if (p->tokens ? !present_count(rec->tokens) : !absent_count(rec->tokens))
        return NULL;
    if (p->tokens) {
        int idle = mfu_idle(p->mfu);
        if (idle <= 0)
            return NULL; /* with the error set where there was one */
    }
    if (p->memory) { /* m = rec.memory; row: int(m[0]) ... int(m[3]): four exact ints taken as they are */
        PyObject *m = rec->memory;
        if (m == NULL || !PyTuple_CheckExact(m) || PyTuple_GET_SIZE(m) < 4)
            return NULL;
        for (i = 0; i < 4; i++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(m, i)))
                return NULL;
    }
    else if (rec->memory != Py_None)
        return NULL;
    lg = rec->logs;
    if (nlogs) { /* lg = rec.logs; if not lg or tuple(lg) != LOGS: return None; each a finite float */
        PyObject *key, *value;
        if (lg == NULL || !PyDict_CheckExact(lg) || PyDict_GET_SIZE(lg) != nlogs)
            return NULL;
        for (i = 0; PyDict_Next(lg, &pos, &key, &value); i++)
            if (!same_name(key, PyTuple_GET_ITEM(p->logs, i)) || !PyFloat_CheckExact(value)
                || !isfinite(PyFloat_AS_DOUBLE(value)))
                return NULL;
    }
    else if (!(lg == Py_None || (lg != NULL && PyDict_CheckExact(lg) && PyDict_GET_SIZE(lg) == 0)))
        return NULL;

    /* (step, t0 + off, t1 + off, t1 - t0, [w], p0.., [c], [f], [sa, sa / dt], [tk, tk / dt], [m0..m3], [l0..], t1 + off) */
    if ((row = PyTuple_New(p->width)) == NULL)
        return NULL;
    if ((end_ns = PyLong_FromLongLong(end)) == NULL) {
        Py_DECREF(row);
        return NULL;
    }
    PUT_REF(rec->step);
    PUT(PyLong_FromLongLong(start));
    PUT_REF(end_ns);
    PUT(PyLong_FromLongLong(dur));
    if (p->wait)
        PUT_REF(rec->wait_ns);
    for (i = 0; i < nph; i++)
        PUT_REF(PyTuple_GET_ITEM(ph, 2 * i + 1));
    if (p->comm)
        PUT_REF(rec->comm_ns);
    if (p->inflight)
        PUT_REF(rec->inflight_ns);
    if (p->samples) {
        PUT_REF(rec->samples);
        PUT(PyFloat_FromDouble((double)PyLong_AsLongLong(rec->samples) / dt));
    }
    if (p->tokens) {
        PUT_REF(rec->tokens);
        PUT(PyFloat_FromDouble((double)PyLong_AsLongLong(rec->tokens) / dt));
    }
    if (p->memory)
        for (i = 0; i < 4; i++)
            PUT_REF(PyTuple_GET_ITEM(rec->memory, i));
    if (nlogs) {
        PyObject *key, *value;
        pos = 0;
        while (PyDict_Next(lg, &pos, &key, &value))
            PUT_REF(value);
    }
    PyTuple_SET_ITEM(row, k++, end_ns); /* the timestamp, last: end_ns's own reference */
    untrack_plain(row); /* numbers: kept by the report and the client, never traversed */
    return row;
fail:
    Py_DECREF(end_ns);
    Py_DECREF(row);
    return NULL;
}
#undef PUT
#undef PUT_REF

static long long
offset_of(PyObject *off, int *fits)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(off, &overflow);
    *fits = !overflow && !(v == -1 && PyErr_Occurred());
    return v;
}

/* plan(rec, off): the row, or None */
static PyObject *
Plan_call(PlanObject *self, PyObject *args, PyObject *kwds)
{
    PyObject *rec, *off, *row;
    long long offset;
    int fits;
    static char *kwlist[] = {"rec", "off", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO:RowPlan", kwlist, &rec, &off))
        return NULL;
    offset = offset_of(off, &fits);
    if (PyErr_Occurred())
        return NULL;
    row = fits ? plan_row(self, rec, offset) : NULL;
    if (row == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return row;
}

/* plan.take(queue, n, off): the rows of the fitting records at the deque's head, at most n, taken off it */
static PyObject *
Plan_take(PlanObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *queue, *rows, *popleft, *head, *row, *popped;
    Py_ssize_t n, size;
    long long offset;
    int fits;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "take(queue, n, off) takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    queue = args[0];
    if ((n = PyLong_AsSsize_t(args[1])) == -1 && PyErr_Occurred())
        return NULL;
    offset = offset_of(args[2], &fits);
    if (PyErr_Occurred())
        return NULL;
    if ((rows = PyList_New(0)) == NULL)
        return NULL;
    if (!fits) /* an offset past int64: no row here, all of them in the general path */
        return rows;
    if ((popleft = PyObject_GetAttr(queue, str_popleft)) == NULL) {
        Py_DECREF(rows);
        return NULL;
    }
    while (PyList_GET_SIZE(rows) < n) {
        if ((size = PyObject_Size(queue)) <= 0) {
            if (size < 0)
                goto fail;
            break;
        }
        if ((head = PySequence_GetItem(queue, 0)) == NULL)
            goto fail;
        if (!Py_IS_TYPE(head, RecordType) || ((RecordObject *)head)->gpu_pairs != Py_None) {
            Py_DECREF(head); /* a point, or a step waiting for its CUDA events: the worker's */
            break;
        }
        row = plan_row(self, head, offset);
        Py_DECREF(head);
        if (row == NULL) { /* not this plan's, or an error: the general path makes its row, or says why */
            PyErr_Clear();
            break;
        }
        popped = PyObject_CallNoArgs(popleft);
        if (popped == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(popped);
            Py_DECREF(row);
            goto fail;
        }
        Py_DECREF(popped);
        Py_DECREF(row);
    }
    Py_DECREF(popleft);
    return rows;
fail:
    Py_DECREF(popleft);
    Py_DECREF(rows);
    return NULL;
}

static int
Plan_traverse(PlanObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->phases);
    Py_VISIT(self->logs);
    Py_VISIT(self->mfu);
    return 0;
}

static int
Plan_clear(PlanObject *self)
{
    Py_CLEAR(self->phases);
    Py_CLEAR(self->logs);
    Py_CLEAR(self->mfu);
    return 0;
}

static void
Plan_dealloc(PyObject *self)
{
    dealloc_with(self, (inquiry)Plan_clear);
}

static PyMethodDef Plan_methods[] = {
    {"take", (PyCFunction)(void (*)(void))Plan_take, METH_FASTCALL,
     "take(queue, n, off): the rows of the records at the head of queue that fit (at most n), taken off it."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Plan_slots[] = {
    {Py_tp_doc, "RowPlan(layout, mfu): one layout's step rows (gpulse.training.plans.PyRowPlan, in C)."},
    {Py_tp_new, Plan_new},
    {Py_tp_call, Plan_call},
    {Py_tp_dealloc, Plan_dealloc},
    {Py_tp_traverse, Plan_traverse},
    {Py_tp_clear, Plan_clear},
    {Py_tp_methods, Plan_methods},
    {0, NULL},
};

static PyType_Spec Plan_spec = {
    .name = "gpulse.training._rows.RowPlan",
    .basicsize = sizeof(PlanObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = Plan_slots,
};

static int
rows_exec(PyObject *module)
{
    PyObject *hot, *type;
    if ((str_popleft = PyUnicode_InternFromString("popleft")) == NULL
        || (str_fixed = PyUnicode_InternFromString("fixed")) == NULL
        || (str_model = PyUnicode_InternFromString("model")) == NULL)
        return -1;
    if ((hot = PyImport_ImportModule("gpulse.training._hotpath")) == NULL)
        return -1; /* an ImportError: plans then uses its Python reference */
    RecordType = (PyTypeObject *)PyObject_GetAttrString(hot, "StepRecord"); /* kept for the process's life */
    Py_DECREF(hot);
    if (RecordType == NULL)
        return -1;
    if (!PyType_Check(RecordType) || RecordType->tp_basicsize != (Py_ssize_t)sizeof(RecordObject)) {
        PyErr_SetString(PyExc_ImportError, "gpulse.training._hotpath.StepRecord is not the struct of _record.h");
        return -1;
    }
    if ((type = PyType_FromSpec(&Plan_spec)) == NULL)
        return -1;
    if (PyModule_AddObject(module, "RowPlan", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot rows_module_slots[] = {
    {Py_mod_exec, rows_exec},
    {0, NULL},
};

static struct PyModuleDef rows_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gpulse.training._rows",
    .m_doc = "The worker's step rows in C: RowPlan (see gpulse.training.plans).",
    .m_size = 0,
    .m_slots = rows_module_slots,
};

PyMODINIT_FUNC
PyInit__rows(void)
{
    return PyModuleDef_Init(&rows_module);
}
