/* The entropy index (jpegindex.c), registered by the module in jpegroi.c. */
#ifndef FASTDATA_JPEGINDEX_H
#define FASTDATA_JPEGINDEX_H
#include <Python.h>
PyObject *entropy_index(PyObject *self, PyObject *args);
PyObject *crop_jpeg(PyObject *self, PyObject *args);
#endif
