/* imageops.c: uint8 image kernels for the per-sample augmentation ops (torchvision's pixels). */
#ifndef LIGHTNING_FASTDATA_IMAGEOPS_H
#define LIGHTNING_FASTDATA_IMAGEOPS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *warp(PyObject *self, PyObject *args);
PyObject *lookup(PyObject *self, PyObject *args);
PyObject *histogram(PyObject *self, PyObject *args);
PyObject *sharpen(PyObject *self, PyObject *args);
PyObject *transpose(PyObject *self, PyObject *args);
PyObject *hue(PyObject *self, PyObject *args);

#endif
