/* Make os.fork() safe against the runtime's thread-state lock (HEAD_LOCK) on the CPython versions that deadlock on it.
 *
 * CPython 3.8 to 3.11.9 (gh-112275; 3.12 and 3.11.10 fixed it): the child of a fork re-creates the runtime's
 * `interpreters.mutex` only after taking it (PyOS_AfterFork_Child -> _PyEval_ReInitThreads ->
 * _PyThreadState_DeleteExcept -> HEAD_LOCK). A thread that held it at the moment of the fork never releases it in the
 * child, which then waits forever before os.fork() returns, a loader worker that never starts. The lock is taken
 * without the GIL by a C thread that enters Python for the first time (PyGILState_Ensure -> PyThreadState_New): torch's
 * gloo work thread does so after every collective (it drops the work's tensors, pybind11 makes a thread state), so a
 * rank that forks its loader workers right after an all-reduce hangs one run in a few.
 *
 * The guard is CPython's own fix from outside: a pthread_atfork prepare handler takes the lock (its holders never
 * wait for the GIL while they hold it, so this waits only for their short critical section), and the parent and
 * child handlers release it, so no fork happens while another thread holds it. Registered once, by install(), where
 * _ext/fork.py finds the bug (3.10, 3.11 before 3.11.10); compiled to do nothing on 3.12+, where CPython handles the
 * lock across fork itself (the lock is not re-entrant: holding it twice would deadlock). */
#define PY_SSIZE_T_CLEAN
#include <patchlevel.h>
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030C0000
#define FORKGUARD_POSSIBLE 1
#define Py_BUILD_CORE_MODULE 1 /* the runtime's struct, as CPython's own shared modules see it */
#endif
#include <Python.h>
#include <pthread.h>

#if FORKGUARD_POSSIBLE
#include "internal/pycore_runtime.h"

static void take_head_lock(void) { PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK); }
static void release_head_lock(void) { PyThread_release_lock(_PyRuntime.interpreters.mutex); }
#else
#define FORKGUARD_POSSIBLE 0
#endif

static int installed = 0;

static PyObject *install(PyObject *self, PyObject *noargs) {
#if FORKGUARD_POSSIBLE
    if (!installed) {
        if (_PyRuntime.interpreters.mutex == NULL) return PyErr_Format(PyExc_RuntimeError, "no runtime lock to guard");
        int err = pthread_atfork(take_head_lock, release_head_lock, release_head_lock);
        if (err != 0) return PyErr_Format(PyExc_OSError, "pthread_atfork failed (%d)", err);
        installed = 1;
    }
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *is_installed(PyObject *self, PyObject *noargs) { return PyBool_FromLong(installed); }

static PyMethodDef methods[] = {
    {"install", install, METH_NOARGS,
     "Register the fork handlers that hold the runtime's thread-state lock across fork(); True if registered."},
    {"installed", is_installed, METH_NOARGS, "Whether install() registered the handlers in this process."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_forkguard", "Fork-safe runtime lock (gh-112275).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__forkguard(void) { return PyModule_Create(&module); }
