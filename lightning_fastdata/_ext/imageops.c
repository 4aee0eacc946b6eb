/* uint8 image kernels for the per-sample augmentation ops: the pixels of torchvision's ops on a CPU, faster.
 *
 * Images are N x C x H x W uint8 with any strides (given in bytes, for the source and the destination apart), so
 * a crop stored channels-last is read and written where it lies, without a copy.
 *
 * warp: torchvision's F.affine / F.rotate (nearest, bilinear). torchvision builds a grid with a bmm of its base
 * grid (pixel centres relative to the image centre, and 1) and the rescaled inverse affine, then samples the image
 * converted to float with grid_sample(padding_mode="zeros", align_corners=False). Here, per output pixel and per
 * coordinate, the same float32 arithmetic in the same order: g = (b_x * s0 + b_y * s1) + s2 (what that bmm
 * computes on a CPU); nearest: the source pixel (g + 1) * (size / 2) - 0.5 rounded half to even, outside the image
 * `fill`; bilinear: see bilinear_one. Compiled with -ffp-contract=off: only the multiply-adds written as fmaf are
 * fused. The pure-torch version of the nearest arithmetic is ops._gather_nearest.
 *
 * lookup and histogram: a 256-entry table per channel, and the counts of the 256 levels per channel (the ops that
 * map each level of a channel to one level: brightness, contrast, solarize, autocontrast, equalize).
 *
 * sharpen: torchvision's adjust_sharpness (see the function).
 *
 * tests/loading/test_augment.py compares every op at every magnitude with torchvision's, bit for bit. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imageops.h"

typedef struct {
    Py_ssize_t n, c, h, w;
} shape4;

typedef struct {
    Py_ssize_t n, c, h, w;
} strides4;

/* Bytes after a padded copy: a 4-byte gather at its last pixel stays inside the allocation. */
#define PAD_SLACK 16

/* The largest offset + 1 that strides reach in a shape (0 for an empty shape): what the buffer must hold. */
static Py_ssize_t extent(shape4 s, strides4 t) {
    if (s.n <= 0 || s.c <= 0 || s.h <= 0 || s.w <= 0) return 0;
    if (t.n < 0 || t.c < 0 || t.h < 0 || t.w < 0) return -1;
    return (s.n - 1) * t.n + (s.c - 1) * t.c + (s.h - 1) * t.h + (s.w - 1) * t.w + 1;
}

/* The end of every entry point: release its buffers; return None, or raise MemoryError (ok < 0) or
 * ValueError(message) (ok == 0: buffers smaller than the shape the caller gave, the caller's bug). */
static PyObject *finish(int ok, const char *message, Py_buffer *buffers[], int count) {
    for (int k = 0; k < count; k++) PyBuffer_Release(buffers[k]);
    if (ok < 0) return PyErr_NoMemory();
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, message);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* v rounded half to even, for |v| < 2^22 (the default rounding mode, as nearbyintf, which was a libm call per
 * pixel): adding and subtracting 1.5 * 2^23 leaves no fraction bits (not folded away: no -ffast-math). */
static inline float round_even(float v) {
    const float t = v + 12582912.0f;
    return t - 12582912.0f;
}

/* The grid coordinates (x, y) of the output pixel at base-grid column b_x in a row whose b_y terms are ry_x, ry_y:
 * (b_x * s0 + b_y * s1) + s2 per coordinate, one rounding per operation (what torchvision's bmm computes on a CPU). */
static inline void grid_point(float b_x, float ry_x, float ry_y, const float *s, float *gx, float *gy) {
    *gx = b_x * s[0] + ry_x + s[2];
    *gy = b_x * s[3] + ry_y + s[5];
}

/* The nearest source pixel of grid coordinate g on an axis of `size` pixels, or -1 outside the image. */
static inline Py_ssize_t nearest_pixel(float g, float half, Py_ssize_t size) {
    const float v = (g + 1.0f) * half - 0.5f;
    if (!(v > -1.0f && v < (float)size)) return -1; /* cannot round into the image (NaN too) */
    const float r = round_even(v);
    return (r >= 0.0f && r <= (float)(size - 1)) ? (Py_ssize_t)r : -1;
}

/* floor of v for v > -1 (no libm call). */
static inline Py_ssize_t floor_above_minus_one(float v) {
    Py_ssize_t i = (Py_ssize_t)v;
    return ((float)i > v) ? i - 1 : i;
}

static void nearest_one(const uint8_t *src, strides4 ss, uint8_t *dst, strides4 ds, shape4 sh, const float *bx,
                        const float *by, const float *s, uint8_t fill) {
    const float half_w = (float)sh.w / 2.0f, half_h = (float)sh.h / 2.0f;
    for (Py_ssize_t i = 0; i < sh.h; i++) {
        const float ry_x = by[i] * s[1], ry_y = by[i] * s[4];
        for (Py_ssize_t j = 0; j < sh.w; j++) {
            float gx, gy;
            grid_point(bx[j], ry_x, ry_y, s, &gx, &gy);
            const Py_ssize_t x = nearest_pixel(gx, half_w, sh.w), y = nearest_pixel(gy, half_h, sh.h);
            uint8_t *out = dst + i * ds.h + j * ds.w;
            if (x >= 0 && y >= 0) {
                const uint8_t *in = src + y * ss.h + x * ss.w;
                for (Py_ssize_t ch = 0; ch < sh.c; ch++) out[ch * ds.c] = in[ch * ss.c];
            } else {
                for (Py_ssize_t ch = 0; ch < sh.c; ch++) out[ch * ds.c] = fill;
            }
        }
    }
}

/* grid_sample(mode="bilinear", padding_mode="zeros", align_corners=False) of one uint8 image, then rounded half to
 * even as torchvision's uint8 output: torch's AVX2 kernel fuses the unnormalisation and the weighted sum into
 * multiply-adds (fmaf here, with the products and their order of that kernel). The source is read from a planar
 * copy with a border of zeros (`padded`, C x (h + 2) x (w + 2), and slack), so that every neighbour of a source
 * point inside (-1, size) is a valid read (zeros padding without a test per neighbour). */
static void pad_planar(const uint8_t *src, strides4 ss, shape4 sh, uint8_t *padded) {
    const Py_ssize_t h = sh.h, w = sh.w, pw = w + 2, pplane = (h + 2) * (w + 2);
    memset(padded, 0, (size_t)(sh.c * pplane + PAD_SLACK));
    for (Py_ssize_t ch = 0; ch < sh.c; ch++)
        for (Py_ssize_t i = 0; i < h; i++) {
            uint8_t *row = padded + ch * pplane + (i + 1) * pw + 1;
            const uint8_t *in = src + ch * ss.c + i * ss.h;
            if (ss.w == 1)
                memcpy(row, in, (size_t)w);
            else
                for (Py_ssize_t j = 0; j < w; j++) row[j] = in[j * ss.w];
        }
}

/* Output pixels j0 .. w-1 of row i, one at a time. Compiled twice: with FMA instructions for CPUs that have them,
 * with libm's fmaf (slower, the same results) elsewhere. */
__attribute__((target_clones("fma", "default")))
static void bilinear_row(const uint8_t *padded, uint8_t *dst, strides4 ds, shape4 sh, Py_ssize_t i, Py_ssize_t j0,
                         const float *bx, const float *by, const float *s) {
    const Py_ssize_t h = sh.h, w = sh.w, pw = w + 2, pplane = (h + 2) * (w + 2);
    const float half_w = (float)w / 2.0f, half_h = (float)h / 2.0f;
    const float ry_x = by[i] * s[1], ry_y = by[i] * s[4];
    for (Py_ssize_t j = j0; j < w; j++) {
        float gx, gy;
        grid_point(bx[j], ry_x, ry_y, s, &gx, &gy);
        const float x = fmaf(gx + 1.0f, half_w, -0.5f), y = fmaf(gy + 1.0f, half_h, -0.5f);
        uint8_t *out = dst + i * ds.h + j * ds.w;
        if (!(x > -1.0f && x < (float)w && y > -1.0f && y < (float)h)) { /* every neighbour outside (NaN too) */
            for (Py_ssize_t ch = 0; ch < sh.c; ch++) out[ch * ds.c] = 0;
            continue;
        }
        const Py_ssize_t x0 = floor_above_minus_one(x), y0 = floor_above_minus_one(y);
        const float fw = x - (float)x0, fe = 1.0f - fw, fn = y - (float)y0, fs = 1.0f - fn;
        const float nw = fs * fe, ne = fs * fw, sw = fn * fe, se = fn * fw;
        const uint8_t *p = padded + (y0 + 1) * pw + (x0 + 1);
        for (Py_ssize_t ch = 0; ch < sh.c; ch++, p += pplane) {
            float acc = (float)p[0] * nw;
            acc = fmaf((float)p[1], ne, acc);
            acc = fmaf((float)p[pw], sw, acc);
            acc = fmaf((float)p[pw + 1], se, acc);
            const float r = round_even(acc);
            out[ch * ds.c] = r <= 0.0f ? 0 : (r >= 255.0f ? 255 : (uint8_t)r);
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1

/* The same arithmetic, eight output pixels at a time (AVX2 + FMA: the same IEEE operations lane by lane, so the same
 * results as bilinear_row); the row's last w % 8 pixels by bilinear_row. */
__attribute__((target("avx2,fma")))
static void bilinear_avx2(const uint8_t *padded, uint8_t *dst, strides4 ds, shape4 sh, const float *bx,
                          const float *by, const float *s) {
    const Py_ssize_t h = sh.h, w = sh.w, pw = w + 2, pplane = (h + 2) * (w + 2);
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
    const __m256 half_w = _mm256_set1_ps((float)w / 2.0f), half_h = _mm256_set1_ps((float)h / 2.0f);
    const __m256 minus_half = _mm256_set1_ps(-0.5f), minus_one = _mm256_set1_ps(-1.0f);
    const __m256 wf = _mm256_set1_ps((float)w), hf = _mm256_set1_ps((float)h);
    const __m256 s0 = _mm256_set1_ps(s[0]), s2 = _mm256_set1_ps(s[2]), s3 = _mm256_set1_ps(s[3]),
                 s5 = _mm256_set1_ps(s[5]);
    const __m256i byte = _mm256_set1_epi32(0xFF), vpw = _mm256_set1_epi32((int)pw), vone = _mm256_set1_epi32(1);
    const Py_ssize_t vec_end = w - w % 8;
    int32_t lanes[8];
    for (Py_ssize_t i = 0; i < h; i++) {
        const __m256 ry_x = _mm256_set1_ps(by[i] * s[1]), ry_y = _mm256_set1_ps(by[i] * s[4]);
        for (Py_ssize_t j = 0; j < vec_end; j += 8) {
            const __m256 vbx = _mm256_loadu_ps(bx + j);
            const __m256 gx = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(vbx, s0), ry_x), s2);
            const __m256 gy = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(vbx, s3), ry_y), s5);
            __m256 x = _mm256_fmadd_ps(_mm256_add_ps(gx, one), half_w, minus_half);
            __m256 y = _mm256_fmadd_ps(_mm256_add_ps(gy, one), half_h, minus_half);
            const __m256 inside = _mm256_and_ps(
                _mm256_and_ps(_mm256_cmp_ps(x, minus_one, _CMP_GT_OQ), _mm256_cmp_ps(x, wf, _CMP_LT_OQ)),
                _mm256_and_ps(_mm256_cmp_ps(y, minus_one, _CMP_GT_OQ), _mm256_cmp_ps(y, hf, _CMP_LT_OQ)));
            x = _mm256_and_ps(x, inside); /* lanes outside read pixel (0, 0) of the padding; their result is 0 */
            y = _mm256_and_ps(y, inside);
            const __m256 x0 = _mm256_floor_ps(x), y0 = _mm256_floor_ps(y);
            const __m256 fw = _mm256_sub_ps(x, x0), fe = _mm256_sub_ps(one, fw);
            const __m256 fn = _mm256_sub_ps(y, y0), fs = _mm256_sub_ps(one, fn);
            const __m256 nw = _mm256_mul_ps(fs, fe), ne = _mm256_mul_ps(fs, fw);
            const __m256 sw = _mm256_mul_ps(fn, fe), se = _mm256_mul_ps(fn, fw);
            const __m256i index = _mm256_add_epi32(
                _mm256_mullo_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(y0), vone), vpw),
                _mm256_add_epi32(_mm256_cvttps_epi32(x0), vone));
            const __m256i keep = _mm256_castps_si256(inside);
            for (Py_ssize_t ch = 0; ch < sh.c; ch++) {
                const uint8_t *plane = padded + ch * pplane;
                const __m256i upper = _mm256_i32gather_epi32((const int *)plane, index, 1);
                const __m256i lower = _mm256_i32gather_epi32((const int *)(plane + pw), index, 1);
                const __m256 a = _mm256_cvtepi32_ps(_mm256_and_si256(upper, byte));
                const __m256 b = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(upper, 8), byte));
                const __m256 c = _mm256_cvtepi32_ps(_mm256_and_si256(lower, byte));
                const __m256 d = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lower, 8), byte));
                __m256 acc = _mm256_mul_ps(a, nw);
                acc = _mm256_fmadd_ps(b, ne, acc);
                acc = _mm256_fmadd_ps(c, sw, acc);
                acc = _mm256_fmadd_ps(d, se, acc);
                acc = _mm256_round_ps(acc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                acc = _mm256_min_ps(_mm256_max_ps(acc, zero), top);
                _mm256_storeu_si256((__m256i *)lanes, _mm256_and_si256(_mm256_cvttps_epi32(acc), keep));
                uint8_t *out = dst + ch * ds.c + i * ds.h + j * ds.w;
                for (int k = 0; k < 8; k++) out[k * ds.w] = (uint8_t)lanes[k];
            }
        }
        if (vec_end < w) bilinear_row(padded, dst, ds, sh, i, vec_end, bx, by, s);
    }
}
#endif

static void bilinear_one(const uint8_t *src, strides4 ss, uint8_t *dst, strides4 ds, shape4 sh, uint8_t *padded,
                         const float *bx, const float *by, const float *s, int avx2) {
    pad_planar(src, ss, sh, padded);
#ifdef HAVE_AVX2_PATH
    if (avx2) {
        bilinear_avx2(padded, dst, ds, sh, bx, by, s);
        return;
    }
#endif
    (void)avx2;
    for (Py_ssize_t i = 0; i < sh.h; i++) bilinear_row(padded, dst, ds, sh, i, 0, bx, by, s);
}

static int cpu_has_avx2_fma(void) {
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* warp(src, src_strides, dst, dst_strides, (n, c, h, w), bx, by, params, fill[, bilinear]) */
PyObject *warp(PyObject *self, PyObject *args) {
    Py_buffer src, dst, bx, by, params;
    shape4 sh;
    strides4 ss, ds;
    int fill, bilinear = 0;
    if (!PyArg_ParseTuple(args, "y*(nnnn)w*(nnnn)(nnnn)y*y*y*i|p", &src, &ss.n, &ss.c, &ss.h, &ss.w, &dst, &ds.n, &ds.c,
                          &ds.h, &ds.w, &sh.n, &sh.c, &sh.h, &sh.w, &bx, &by, &params, &fill, &bilinear))
        return NULL;
    const Py_ssize_t src_extent = extent(sh, ss), dst_extent = extent(sh, ds);
    int ok = src_extent >= 0 && dst_extent >= 0 && src.len >= src_extent && dst.len >= dst_extent &&
             bx.len >= sh.w * (Py_ssize_t)sizeof(float) && by.len >= sh.h * (Py_ssize_t)sizeof(float) &&
             params.len >= sh.n * 6 * (Py_ssize_t)sizeof(float);
    uint8_t *padded = NULL;
    if (ok && bilinear && sh.n > 0) {
        padded = malloc((size_t)(sh.c * (sh.h + 2) * (sh.w + 2) + PAD_SLACK));
        if (!padded) ok = -1;
    }
    if (ok == 1) {
        const uint8_t *in = src.buf;
        uint8_t *out = dst.buf;
        const int avx2 = bilinear && cpu_has_avx2_fma() && !getenv("LIGHTNING_FASTDATA_NO_AVX2");
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t k = 0; k < sh.n; k++) {
            const float *theta = (const float *)params.buf + 6 * k;
            if (bilinear)
                bilinear_one(in + k * ss.n, ss, out + k * ds.n, ds, sh, padded, bx.buf, by.buf, theta, avx2);
            else
                nearest_one(in + k * ss.n, ss, out + k * ds.n, ds, sh, bx.buf, by.buf, theta, (uint8_t)fill);
        }
        Py_END_ALLOW_THREADS
    }
    free(padded);
    Py_buffer *buffers[] = {&src, &dst, &bx, &by, &params};
    return finish(ok, "warp: buffers smaller than the shape and strides given", buffers, 5);
}

/* lookup(src, src_strides, dst, dst_strides, (c, h, w), table, rows): dst = table[channel % rows][src]. */
PyObject *lookup(PyObject *self, PyObject *args) {
    Py_buffer src, dst, table;
    shape4 sh = {1, 0, 0, 0};
    strides4 ss = {0, 0, 0, 0}, ds = {0, 0, 0, 0};
    Py_ssize_t rows;
    if (!PyArg_ParseTuple(args, "y*(nnn)w*(nnn)(nnn)y*n", &src, &ss.c, &ss.h, &ss.w, &dst, &ds.c, &ds.h, &ds.w, &sh.c,
                          &sh.h, &sh.w, &table, &rows))
        return NULL;
    const Py_ssize_t src_extent = extent(sh, ss), dst_extent = extent(sh, ds);
    const int ok = rows > 0 && src_extent >= 0 && dst_extent >= 0 && src.len >= src_extent && dst.len >= dst_extent &&
                   table.len >= rows * 256;
    if (ok) {
        const uint8_t *in = src.buf, *t = table.buf;
        uint8_t *out = dst.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t ch = 0; ch < sh.c; ch++) {
            const uint8_t *row = t + 256 * (ch % rows);
            for (Py_ssize_t i = 0; i < sh.h; i++) {
                const uint8_t *a = in + ch * ss.c + i * ss.h;
                uint8_t *b = out + ch * ds.c + i * ds.h;
                if (ss.w == 1 && ds.w == 1) { /* planar rows: four independent lookups a step */
                    Py_ssize_t j = 0;
                    for (; j + 4 <= sh.w; j += 4) {
                        const uint8_t v0 = row[a[j]], v1 = row[a[j + 1]], v2 = row[a[j + 2]], v3 = row[a[j + 3]];
                        b[j] = v0, b[j + 1] = v1, b[j + 2] = v2, b[j + 3] = v3;
                    }
                    for (; j < sh.w; j++) b[j] = row[a[j]];
                } else {
                    for (Py_ssize_t j = 0; j < sh.w; j++) b[j * ds.w] = row[a[j * ss.w]];
                }
            }
        }
        Py_END_ALLOW_THREADS
    }
    Py_buffer *buffers[] = {&src, &dst, &table};
    return finish(ok, "lookup: buffers smaller than the shape and strides given", buffers, 3);
}

/* histogram(src, src_strides, (c, h, w), counts): counts[ch][v] (int64) = how many pixels of channel ch equal v. */
PyObject *histogram(PyObject *self, PyObject *args) {
    Py_buffer src, counts;
    shape4 sh = {1, 0, 0, 0};
    strides4 ss = {0, 0, 0, 0};
    if (!PyArg_ParseTuple(args, "y*(nnn)(nnn)w*", &src, &ss.c, &ss.h, &ss.w, &sh.c, &sh.h, &sh.w, &counts)) return NULL;
    const Py_ssize_t src_extent = extent(sh, ss);
    const int ok = src_extent >= 0 && src.len >= src_extent && counts.len >= sh.c * 256 * (Py_ssize_t)sizeof(int64_t);
    if (ok) {
        const uint8_t *in = src.buf;
        int64_t *out = counts.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t ch = 0; ch < sh.c; ch++) {
            /* two partial histograms: neighbouring equal levels do not wait on one counter */
            int64_t part[2][256] = {{0}};
            for (Py_ssize_t i = 0; i < sh.h; i++) {
                const uint8_t *a = in + ch * ss.c + i * ss.h;
                Py_ssize_t j = 0;
                if (ss.w == 1) {
                    for (; j + 2 <= sh.w; j += 2) {
                        part[0][a[j]]++;
                        part[1][a[j + 1]]++;
                    }
                } else {
                    for (; j + 2 <= sh.w; j += 2) {
                        part[0][a[j * ss.w]]++;
                        part[1][a[(j + 1) * ss.w]]++;
                    }
                }
                for (; j < sh.w; j++) part[0][a[j * ss.w]]++;
            }
            for (int v = 0; v < 256; v++) out[ch * 256 + v] = part[0][v] + part[1][v];
        }
        Py_END_ALLOW_THREADS
    }
    Py_buffer *buffers[] = {&src, &counts};
    return finish(ok, "histogram: buffers smaller than the shape and strides given", buffers, 2);
}

/* One sharpened pixel: v, its 3x3 sum with the centre counted 5 times, alpha = 1 - factor (see sharpen). */
static inline uint8_t sharpen_pixel(int32_t sum, int32_t v, float alpha) {
    const int32_t blur = (2 * sum + 13) / 26;
    float mix = (float)v + alpha * (float)(blur - v);
    mix = mix < 0.0f ? 0.0f : mix;
    mix = mix > 255.0f ? 255.0f : mix;
    return (uint8_t)(int32_t)mix;
}

/* One interior row, planar (unit strides): written so that the compiler vectorises it (a clone for AVX2 CPUs). */
__attribute__((target_clones("avx2", "default")))
static void sharpen_row(const uint8_t *restrict up, const uint8_t *restrict a, const uint8_t *restrict down,
                        uint8_t *restrict b, Py_ssize_t w, float alpha) {
    for (Py_ssize_t j = 1; j < w - 1; j++) {
        const int32_t sum = up[j - 1] + up[j] + up[j + 1] + a[j - 1] + 5 * a[j] + a[j + 1] + down[j - 1] + down[j] +
                            down[j + 1];
        b[j] = sharpen_pixel(sum, a[j], alpha);
    }
}

/* sharpen(src, src_strides, dst, dst_strides, (c, h, w), alpha): torchvision's adjust_sharpness of a uint8 image
 * with alpha = 1 - sharpness_factor. Its blur is conv2d with the kernel (1 1 1; 1 5 1; 1 1 1) / 13 in float32,
 * rounded: the exact value is an integer S / 13, never within 1/26 of a half, far more than float32's error over
 * nine terms, so the rounded blur is exactly (2 S + 13) / 26 in integers, whatever the order of the sum. The blend
 * of an interior pixel is v + alpha * (blur - v) in float32, clamped and truncated; the border is left as it is.
 * fast.py calls this only for the alphas where that blend gives the same bytes fused and unfused (checked over all
 * 65,536 pairs), so the result does not depend on how torch evaluates it either. */
PyObject *sharpen(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    shape4 sh = {1, 0, 0, 0};
    strides4 ss = {0, 0, 0, 0}, ds = {0, 0, 0, 0};
    float alpha;
    if (!PyArg_ParseTuple(args, "y*(nnn)w*(nnn)(nnn)f", &src, &ss.c, &ss.h, &ss.w, &dst, &ds.c, &ds.h, &ds.w, &sh.c,
                          &sh.h, &sh.w, &alpha))
        return NULL;
    const Py_ssize_t src_extent = extent(sh, ss), dst_extent = extent(sh, ds);
    const int ok = src_extent >= 0 && dst_extent >= 0 && src.len >= src_extent && dst.len >= dst_extent;
    if (ok) {
        const uint8_t *in = src.buf;
        uint8_t *out = dst.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t ch = 0; ch < sh.c; ch++)
            for (Py_ssize_t i = 0; i < sh.h; i++) {
                const uint8_t *a = in + ch * ss.c + i * ss.h;
                uint8_t *b = out + ch * ds.c + i * ds.h;
                if (i == 0 || i == sh.h - 1) {
                    for (Py_ssize_t j = 0; j < sh.w; j++) b[j * ds.w] = a[j * ss.w];
                    continue;
                }
                const uint8_t *up = a - ss.h, *down = a + ss.h;
                b[0] = a[0];
                if (ss.w == 1 && ds.w == 1) {
                    sharpen_row(up, a, down, b, sh.w, alpha);
                    b[sh.w - 1] = a[sh.w - 1];
                    continue;
                }
                for (Py_ssize_t j = 1; j < sh.w - 1; j++) { /* any strides: a channels-last view */
                    const Py_ssize_t l = (j - 1) * ss.w, m = j * ss.w, r = (j + 1) * ss.w;
                    const int32_t sum = up[l] + up[m] + up[r] + a[l] + 5 * a[m] + a[r] + down[l] + down[m] + down[r];
                    b[j * ds.w] = sharpen_pixel(sum, a[m], alpha);
                }
                if (sh.w > 1) b[(sh.w - 1) * ds.w] = a[(sh.w - 1) * ss.w];
            }
        Py_END_ALLOW_THREADS
    }
    Py_buffer *buffers[] = {&src, &dst};
    return finish(ok, "sharpen: buffers smaller than the shape and strides given", buffers, 2);
}

/* Three planes of n bytes to n triples, and back: a crop into and out of a channels-last batch slot. Written so that
 * the compiler vectorises them (with byte shuffles: a clone for CPUs with AVX2, ~10x faster than the plain one). */
__attribute__((target_clones("avx2", "default")))
static void interleave3(const uint8_t *restrict a, uint8_t *restrict b, Py_ssize_t n) {
    const uint8_t *a0 = a, *a1 = a + n, *a2 = a + 2 * n;
    for (Py_ssize_t j = 0; j < n; j++) {
        b[3 * j] = a0[j];
        b[3 * j + 1] = a1[j];
        b[3 * j + 2] = a2[j];
    }
}

__attribute__((target_clones("avx2", "default")))
static void deinterleave3(const uint8_t *restrict a, uint8_t *restrict b, Py_ssize_t n) {
    uint8_t *b0 = b, *b1 = b + n, *b2 = b + 2 * n;
    for (Py_ssize_t j = 0; j < n; j++) {
        b0[j] = a[3 * j];
        b1[j] = a[3 * j + 1];
        b2[j] = a[3 * j + 2];
    }
}

/* transpose(src, dst, rows, cols): dst (cols x rows) = the transpose of src (rows x cols), bytes; a C x H x W image
 * to H x W x C (rows = C) and back (cols = C). src and dst must not overlap. */
PyObject *transpose(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t rows, cols;
    if (!PyArg_ParseTuple(args, "y*w*nn", &src, &dst, &rows, &cols)) return NULL;
    const int ok = rows >= 0 && cols >= 0 && src.len >= rows * cols && dst.len >= rows * cols;
    if (ok) {
        const uint8_t *a = src.buf;
        uint8_t *b = dst.buf;
        Py_BEGIN_ALLOW_THREADS
        if (rows == 3)
            interleave3(a, b, cols);
        else if (cols == 3)
            deinterleave3(a, b, rows);
        else if (rows <= cols)
            for (Py_ssize_t j = 0; j < cols; j++) /* few rows (channels): write each output row in order */
                for (Py_ssize_t i = 0; i < rows; i++) b[j * rows + i] = a[i * cols + j];
        else
            for (Py_ssize_t i = 0; i < rows; i++) /* few columns: read each input row in order */
                for (Py_ssize_t j = 0; j < cols; j++) b[j * rows + i] = a[i * cols + j];
        Py_END_ALLOW_THREADS
    }
    Py_buffer *buffers[] = {&src, &dst};
    return finish(ok, "transpose: buffers smaller than rows x cols", buffers, 2);
}

/* A row of pixels through torchvision's adjust_hue of a uint8 image (planar rows r, g, b of n pixels, in place): to
 * float32 (x * (1/255)), _rgb_to_hsv, the hue shifted and taken modulo 1, _hsv_to_rgb, back to uint8 (x * 255.999,
 * truncated): the same float32 operations in the same order as its elementwise tensor ops (a multiply by a bool
 * mask is a select here: x * 1 = x, x * 0 = +-0, and a signed zero is lost when 1.0 is added after). Branch-free,
 * so that the compiler vectorises the loop (every lane the same IEEE operations). */
static void hue_row(uint8_t *restrict r8, uint8_t *restrict g8, uint8_t *restrict b8, Py_ssize_t n, float factor) {
    const float k = (float)(1.0 / 255.0), sixth = (float)(1.0 / 6.0), scale = (float)(255.0 + 1.0 - 1e-3);
    for (Py_ssize_t j = 0; j < n; j++) {
        const float r = (float)r8[j] * k, g = (float)g8[j] * k, b = (float)b8[j] * k;
        const float mx = r > g ? r : g, mn = r < g ? r : g;
        const float maxc = mx > b ? mx : b, minc = mn < b ? mn : b;
        const int eqc = maxc == minc;
        const float range = maxc - minc;
        const float s = range / (eqc ? 1.0f : maxc);
        const float divisor = eqc ? 1.0f : range;
        const float rc = (maxc - r) / divisor, gc = (maxc - g) / divisor, bc = (maxc - b) / divisor;
        const int neq_r = maxc != r, eq_g = maxc == g;
        const float hg = (eq_g & neq_r) ? (rc + 2.0f) - bc : 0.0f;
        const float hr = !neq_r ? bc - gc : 0.0f;
        const float hb = (neq_r & !eq_g) ? (gc + 4.0f) - rc : 0.0f;
        float h = ((hr + hg) + hb) * sixth + 1.0f; /* in (0, 2): fmod(h, 1) is h - 1 from 1 on, exactly (Sterbenz) */
        h = h >= 1.0f ? h - 1.0f : h;
        h = h + factor; /* in [-0.5, 1.5): torch's remainder(h, 1) exactly, as above */
        h = h < 0.0f ? h + 1.0f : h >= 1.0f ? h - 1.0f : h;
        const float h6 = h * 6.0f;
        int i = (int)h6; /* h6 >= 0: truncation is floor (a -0.0 fraction below changes no output) */
        const float f = h6 - (float)i;
        i = i >= 6 ? i - 6 : i; /* a rounding up to 6.0 wraps as torch's remainder does */
        const float v = maxc, sxf = s * f, one_minus_s = 1.0f - s;
        float q = (1.0f - sxf) * v, t = (sxf + one_minus_s) * v, p = one_minus_s * v;
        q = q < 0.0f ? 0.0f : q > 1.0f ? 1.0f : q;
        t = t < 0.0f ? 0.0f : t > 1.0f ? 1.0f : t;
        p = p < 0.0f ? 0.0f : p > 1.0f ? 1.0f : p;
        /* torchvision's select table: r = v q p p t v, g = t v v q p p, b = p p t v v q (for i = 0 .. 5) */
        const float ro = (i == 0 || i == 5) ? v : i == 1 ? q : i == 4 ? t : p;
        const float go = (i == 1 || i == 2) ? v : i == 0 ? t : i == 3 ? q : p;
        const float bo = (i == 3 || i == 4) ? v : i == 2 ? t : i == 5 ? q : p;
        r8[j] = (uint8_t)(ro * scale), g8[j] = (uint8_t)(go * scale), b8[j] = (uint8_t)(bo * scale);
    }
}

/* hue(src, src_strides, dst, dst_strides, (3, h, w), factor): torchvision's adjust_hue of a uint8 RGB image. */
PyObject *hue(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    shape4 sh = {1, 0, 0, 0};
    strides4 ss = {0, 0, 0, 0}, ds = {0, 0, 0, 0};
    float factor;
    if (!PyArg_ParseTuple(args, "y*(nnn)w*(nnn)(nnn)f", &src, &ss.c, &ss.h, &ss.w, &dst, &ds.c, &ds.h, &ds.w, &sh.c,
                          &sh.h, &sh.w, &factor))
        return NULL;
    const Py_ssize_t src_extent = extent(sh, ss), dst_extent = extent(sh, ds);
    const int ok = sh.c == 3 && src_extent >= 0 && dst_extent >= 0 && src.len >= src_extent && dst.len >= dst_extent;
    if (ok) {
        const uint8_t *in = src.buf;
        uint8_t *out = dst.buf;
        uint8_t *rows = malloc(3 * (size_t)(sh.w > 0 ? sh.w : 1));
        if (rows == NULL) {
            Py_buffer *buffers[] = {&src, &dst};
            return finish(-1, "", buffers, 2);
        }
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < sh.h; i++) { /* a row copied planar, computed, copied back where it lies */
            uint8_t *r = rows, *g = rows + sh.w, *b = rows + 2 * sh.w;
            const uint8_t *a = in + i * ss.h;
            for (Py_ssize_t j = 0; j < sh.w; j++)
                r[j] = a[j * ss.w], g[j] = a[ss.c + j * ss.w], b[j] = a[2 * ss.c + j * ss.w];
            hue_row(r, g, b, sh.w, factor);
            uint8_t *o = out + i * ds.h;
            for (Py_ssize_t j = 0; j < sh.w; j++)
                o[j * ds.w] = r[j], o[ds.c + j * ds.w] = g[j], o[2 * ds.c + j * ds.w] = b[j];
        }
        Py_END_ALLOW_THREADS
        free(rows);
    }
    Py_buffer *buffers[] = {&src, &dst};
    return finish(ok, "hue: three channels, buffers at least the shape and strides given", buffers, 2);
}
