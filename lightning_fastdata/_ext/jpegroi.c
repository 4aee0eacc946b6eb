/* Region-of-interest JPEG decode with libjpeg-turbo: decode only the rows and (iMCU-aligned) columns of
 * a crop, stopping after its last row. jpeg_crop_scanline + jpeg_skip_scanlines (libjpeg-turbo >= 1.5).
 * Optionally at scale_num/8 of the size in the DCT domain (coordinates are then in the scaled image), and with
 * the fast integer IDCT (JDCT_IFAST) instead of the exact one (JDCT_ISLOW, what torchvision and PIL use).
 * The GIL is released while decoding. Errors in the image data raise OSError; a crop box outside the
 * image or a too small output buffer (the caller's bug) raises ValueError. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* dladdr */
#include <Python.h>
#include <dlfcn.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#include "jpegindex.h"
#include "imageops.h"

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} roi_error_mgr;

static void roi_error_exit(j_common_ptr cinfo) {
    roi_error_mgr *err = (roi_error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void roi_emit_message(j_common_ptr cinfo, int msg_level) {
    /* A premature end of data is a truncated file: fail instead of returning grey rows. Other warnings
     * (e.g. extraneous bytes) are what libjpeg, PIL and torchvision all tolerate. */
    if (msg_level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) roi_error_exit(cinfo);
}

static PyObject *header(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    struct jpeg_decompress_struct cinfo;
    roi_error_mgr jerr;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = roi_error_exit;
    jerr.pub.emit_message = roi_emit_message;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        PyBuffer_Release(&data);
        PyErr_Format(PyExc_OSError, "%s", jerr.message);
        return NULL;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
    jpeg_read_header(&cinfo, TRUE);
    PyObject *out = Py_BuildValue("(iii)", (int)cinfo.image_width, (int)cinfo.image_height, (int)cinfo.jpeg_color_space);
    jpeg_destroy_decompress(&cinfo);
    PyBuffer_Release(&data);
    return out;
}

/* decode_crop(data, top, left, height, width, out[, to_end[, scale_num[, fast_idct]]]) -> (x_shift, decoded_width)
 * Writes `height` rows of `decoded_width` RGB pixels into `out` (a writable buffer of at least
 * height * (width + 2 * iMCU width) * 3 bytes); the crop starts `x_shift` pixels into each row.
 * With to_end, the rows below the crop are skipped through (entropy-decoded, not output) to the end of the
 * image, so that a file cut short raises whatever the crop. scale_num (1..16, default 8) decodes at scale_num/8
 * of the size: the crop box is then in the scaled image's pixels (ceil(width * scale_num / 8) wide). */
static PyObject *decode_crop(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int top, left, height, width, to_end = 0, scale_num = 8, fast_idct = 0;
    if (!PyArg_ParseTuple(args, "y*iiiiw*|pip", &data, &top, &left, &height, &width, &out, &to_end, &scale_num,
                          &fast_idct))
        return NULL;
    if (scale_num < 1 || scale_num > 16) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "scale_num must be in 1..16");
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    roi_error_mgr jerr;
    JDIMENSION xoff = 0, cw = 0;
    int failed = 0;
    volatile int bad_args = 0;
    unsigned char *volatile last = NULL; /* scratch row of to_end; freed after a longjmp too */
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = roi_error_exit;
    jerr.pub.emit_message = roi_emit_message;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(jerr.jump)) {
        failed = 1;
    } else {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        cinfo.scale_num = (unsigned int)scale_num;
        cinfo.scale_denom = 8;
        if (fast_idct) cinfo.dct_method = JDCT_IFAST;
        jpeg_start_decompress(&cinfo);
        if (top < 0 || left < 0 || height <= 0 || width <= 0 || (JDIMENSION)(top + height) > cinfo.output_height ||
            (JDIMENSION)(left + width) > cinfo.output_width) {
            bad_args = 1;
        } else {
            /* One column of margin on each side (where the image has one): fancy upsampling replicates the
             * chroma at a decoded region's edge, so an edge that falls on an iMCU boundary would differ from a
             * full decode's pixels there. With the margin the crop's pixels are exactly a full decode's. */
            JDIMENSION margin_left = left > 0 ? 1 : 0;
            xoff = (JDIMENSION)left - margin_left;
            cw = (JDIMENSION)width + margin_left + ((JDIMENSION)(left + width) < cinfo.output_width ? 1 : 0);
            jpeg_crop_scanline(&cinfo, &xoff, &cw);
            if ((Py_ssize_t)height * cw * 3 > out.len) {
                bad_args = 1;
            } else {
                if (top > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
                JSAMPROW row;
                for (int y = 0; y < height; y++) {
                    row = (JSAMPROW)out.buf + (size_t)y * cw * 3;
                    jpeg_read_scanlines(&cinfo, &row, 1);
                }
                if (to_end && cinfo.output_scanline < cinfo.output_height) {
                    /* Skipping to the very end returns at once without reading; so skip all but the last row
                     * and decode that one, which reads the entropy-coded data up to its end. */
                    JDIMENSION remaining = cinfo.output_height - cinfo.output_scanline;
                    if (remaining > 1) jpeg_skip_scanlines(&cinfo, remaining - 1);
                    last = (unsigned char *)malloc((size_t)cw * 3);
                    if (last == NULL) {
                        bad_args = 2;
                    } else {
                        row = (JSAMPROW)last;
                        jpeg_read_scanlines(&cinfo, &row, 1);
                    }
                }
            }
        }
        jpeg_abort_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
    free(last);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (bad_args == 2 && !failed) return PyErr_NoMemory();
    if (failed) {
        PyErr_Format(PyExc_OSError, "%s", jerr.message);
        return NULL;
    }
    if (bad_args) {
        PyErr_SetString(PyExc_ValueError, "crop box outside the image or output buffer too small");
        return NULL;
    }
    return Py_BuildValue("(ii)", (int)((JDIMENSION)left - xoff), (int)cw);
}

/* library() -> str | None: the file of the libjpeg this extension calls (the one that defines jpeg_std_error for
 * it: the wheel's own copy, the system's, or Pillow's loaded at import; native.py). */
static PyObject *library(PyObject *self, PyObject *unused) {
    Dl_info info;
    if (dladdr((void *)&jpeg_std_error, &info) && info.dli_fname != NULL) return PyUnicode_DecodeFSDefault(info.dli_fname);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"library", library, METH_NOARGS, "library() -> str | None: the file of the libjpeg-turbo in use"},
    {"header", header, METH_VARARGS, "header(data) -> (width, height, jpeg_color_space)"},
    {"decode_crop", decode_crop, METH_VARARGS, "decode_crop(data, top, left, height, width, out[, to_end[, scale_num[, fast_idct]]]) -> (x_shift, decoded_width)"},
    {"entropy_index", entropy_index, METH_VARARGS,
     "entropy_index(data, max_fraction=0.015, every=0, min_bytes_per_block=0) -> bytes | None: (jpegindex.c)"},
    {"crop_jpeg", crop_jpeg, METH_VARARGS,
     "crop_jpeg(data, index, row0, row1, col0, col1) -> bytes | None: a JPEG of those MCUs (jpegindex.c)"},
    {"warp", warp, METH_VARARGS,
     "warp(src, src_strides, dst, dst_strides, (n, c, h, w), bx, by, params, fill[, bilinear]) -> None: affine warp "
     "of uint8 images (imageops.c)"},
    {"lookup", lookup, METH_VARARGS,
     "lookup(src, src_strides, dst, dst_strides, (c, h, w), table, rows) -> None: each channel through a 256-entry "
     "table (imageops.c)"},
    {"histogram", histogram, METH_VARARGS,
     "histogram(src, src_strides, (c, h, w), counts) -> None: int64 counts of the 256 levels per channel (imageops.c)"},
    {"sharpen", sharpen, METH_VARARGS,
     "sharpen(src, src_strides, dst, dst_strides, (c, h, w), alpha) -> None: torchvision's adjust_sharpness, "
     "alpha = 1 - factor (imageops.c)"},
    {"transpose", transpose, METH_VARARGS,
     "transpose(src, dst, rows, cols) -> None: dst = the transpose of the bytes src (imageops.c)"},
    {"hue", hue, METH_VARARGS,
     "hue(src, src_strides, dst, dst_strides, (3, h, w), factor) -> None: torchvision's adjust_hue of uint8 RGB "
     "(imageops.c)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegroi", "ROI JPEG decode (libjpeg-turbo).", -1, methods};

PyMODINIT_FUNC PyInit__jpegroi(void) { return PyModule_Create(&module); }
