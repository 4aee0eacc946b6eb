/* Entropy index for baseline JPEGs: decode a crop without entropy-decoding the rest of the image.
 *
 * A baseline JPEG is one Huffman-coded bit stream: to reach a crop, libjpeg decodes every MCU before the crop's
 * last one. entropy_index() walks the stream once and records, at the start of every K-th MCU of each MCU row
 * (and at the stream's end), the bit offset (in the stream with its 0xFF00 stuffing and restart markers removed)
 * and each component's DC predictor. K is chosen per image so that the index stays within a fraction of the
 * file's bytes (10 bytes an entry: one per MCU would be ~7% of a photo's bytes, 13% of a small quality-75 one).
 * crop_jpeg() then assembles a small, valid JPEG of a rectangle of MCUs: the same header with the rectangle's
 * size, a restart interval of one MCU row, and per row the original bits of its MCUs, where only the first DC
 * difference of each component is re-encoded (after a restart the predictor is zero). It reaches the row's first
 * MCU from the entry before it by Huffman-parsing at most K-1 MCUs (no coefficients kept), and copies the row's
 * bits up to the entry after its last MCU (the decoder skips the surplus before the restart marker). Its
 * coefficients are the original's, so decoding it gives the original's pixels wherever the rectangle has a margin
 * of one MCU.
 *
 * Supported: 8-bit baseline/extended sequential Huffman JPEGs, one interleaved scan of all components (or one
 * component with 1x1 sampling), without restart markers or with a restart interval of whole MCU rows (then no
 * row of a crop crosses one: each interval starts byte-aligned with zero predictors, which the walk follows).
 * Anything else returns None and the caller decodes as before; so does a DC value the file's own DC table cannot
 * encode (optimised tables may lack a category).
 * No libjpeg here: only the marker parser and a Huffman decoder; the pixels come from libjpeg (jpegroi.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jpegindex.h"

#define MAX_COMP 3
#define PAD 512 /* zero bytes after the unstuffed stream: a corrupt block may run ~220 bytes past its end before
                  * the per-block bound check, and peek64 reads 8 bytes past any position */

typedef struct {
    uint8_t bits[17];
    uint8_t vals[256];
    int32_t maxcode[17];
    int32_t valoff[17];
    uint16_t lut[512]; /* 9-bit lookahead: (length << 8) | symbol; 0 = a longer code */
    uint16_t skip[512]; /* AC tables, 9-bit lookahead of a whole coefficient: see build_table; 0 = a longer code */
    uint16_t code[256];
    uint8_t size[256]; /* 0: the symbol has no code (for encoding DC categories) */
    int defined;
} htable;

typedef struct {
    int width, height, ncomp;
    int h[MAX_COMP], v[MAX_COMP], dc_tbl[MAX_COMP], ac_tbl[MAX_COMP]; /* in scan order */
    int mcu_w, mcu_h, mcus_per_row, mcu_rows;
    int restart; /* the restart interval in MCUs (0: none); a multiple of mcus_per_row */
    size_t sof_dims;   /* offset of the SOF's height field */
    size_t sos_start;  /* offset of the SOS marker */
    size_t data_start; /* first byte of the entropy-coded data */
    htable dc[4], ac[4];
} jinfo;

typedef struct {
    uint32_t bitpos;
    int16_t dc[MAX_COMP];
} entry;

#define HEADER_BYTES 32 /* "FDX3", MCUs per row, MCU rows (u16), MCU width, height (u8), K: MCUs per entry (u16),
                         * file length (u32), the file's hash (u64), the entries' hash (u64): a damaged index is
                         * refused like another file's */

/* A fast 64-bit hash of the whole file: an index is used only with the very bytes it was built from. */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    return x ^ (x >> 33);
}

static uint64_t file_hash(const uint8_t *d, size_t n) {
    /* Four independent lanes of h = (h + word) * K: each step is a bijection of h, so any single changed word
     * changes the result, and the lanes' multiplies overlap (the bytes are hot: just read). Mixed at the end. */
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h0 = n, h1 = 1, h2 = 2, h3 = 3, w0, w1, w2, w3;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        memcpy(&w0, d + i, 8);
        memcpy(&w1, d + i + 8, 8);
        memcpy(&w2, d + i + 16, 8);
        memcpy(&w3, d + i + 24, 8);
        h0 = (h0 + w0) * k;
        h1 = (h1 + w1) * k;
        h2 = (h2 + w2) * k;
        h3 = (h3 + w3) * k;
    }
    uint64_t x = mix64(h0) ^ mix64(h1 + 0x632BE59BD9B4E019ull) ^ mix64(h2 + 0x85EBCA77C2B2AE63ull) ^ mix64(h3 ^ k);
    for (; i < n; i++) x = (x + d[i]) * k;
    return mix64(x);
}
#define ENTRY_BYTES 10

#define SKIP_END 0x8000

static int build_table(htable *t) {
    int32_t code = 0;
    int k = 0;
    memset(t->lut, 0, sizeof t->lut);
    memset(t->skip, 0, sizeof t->skip);
    memset(t->size, 0, sizeof t->size);
    for (int l = 1; l <= 16; l++) {
        t->valoff[l] = k - code;
        for (int i = 0; i < t->bits[l]; i++, k++, code++) {
            /* more codes than the length allows: a broken table, refused before its code indexes the LUT (the
             * fuzzer's first find: a damaged DHT wrote past lut[512]) */
            if (code >= (1 << l)) return -1;
            int sym = t->vals[k];
            if (l <= 9) {
                int lo = code << (9 - l), count = 1 << (9 - l);
                /* skip: the bits of the code and its value (bits 0-4), the coefficients it advances (5-9; 16 for
                 * ZRL), SKIP_END for an end of block (a run/size of size 0 other than ZRL) */
                int r = sym >> 4, size = sym & 15;
                uint16_t sk = size ? (uint16_t)((l + size) | ((r + 1) << 5))
                                   : (uint16_t)(r == 15 ? (l | (16 << 5)) : (l | SKIP_END));
                for (int x = 0; x < count; x++) {
                    t->lut[lo + x] = (uint16_t)((l << 8) | sym);
                    t->skip[lo + x] = sk;
                }
            }
            if (!t->size[sym]) {
                t->code[sym] = (uint16_t)code;
                t->size[sym] = (uint8_t)l;
            }
        }
        t->maxcode[l] = t->bits[l] ? code - 1 : -1;
        code <<= 1;
    }
    t->defined = 1;
    return 0;
}

static int parse(const uint8_t *d, size_t n, jinfo *j) {
    int ids[MAX_COMP], sof_h[MAX_COMP], sof_v[MAX_COMP], have_sof = 0;
    memset(j, 0, sizeof *j);
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return -1;
    size_t pos = 2;
    while (pos + 4 <= n) {
        if (d[pos] != 0xFF) return -1;
        while (pos < n && d[pos] == 0xFF) pos++;
        if (pos + 3 > n) return -1;
        int m = d[pos++];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;
        if (m == 0xD8 || m == 0xD9) return -1;
        size_t len = ((size_t)d[pos] << 8) | d[pos + 1];
        if (len < 2 || pos + len > n) return -1;
        const uint8_t *s = d + pos + 2;
        size_t slen = len - 2;
        if (m == 0xC0 || m == 0xC1) {
            if (slen < 6 || s[0] != 8) return -1;
            j->height = (s[1] << 8) | s[2];
            j->width = (s[3] << 8) | s[4];
            j->ncomp = s[5];
            if ((j->ncomp != 1 && j->ncomp != 3) || slen < 6 + 3 * (size_t)j->ncomp || !j->width || !j->height)
                return -1;
            for (int c = 0; c < j->ncomp; c++) {
                ids[c] = s[6 + 3 * c];
                sof_h[c] = s[7 + 3 * c] >> 4;
                sof_v[c] = s[7 + 3 * c] & 15;
                if (sof_h[c] < 1 || sof_h[c] > 2 || sof_v[c] < 1 || sof_v[c] > 2) return -1;
            }
            j->sof_dims = pos + 3;
            have_sof = 1;
        } else if ((m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC)) {
            return -1; /* progressive, lossless, arithmetic-coded, hierarchical */
        } else if (m == 0xC4) {
            size_t k = 0;
            while (k < slen) {
                int tc = s[k] >> 4, th = s[k] & 15;
                if (tc > 1 || th > 3 || k + 17 > slen) return -1;
                htable *t = tc ? &j->ac[th] : &j->dc[th];
                int total = 0;
                t->bits[0] = 0;
                for (int l = 1; l <= 16; l++) total += (t->bits[l] = s[k + l]);
                if (total > 256 || k + 17 + (size_t)total > slen) return -1;
                memcpy(t->vals, s + k + 17, (size_t)total);
                if (build_table(t)) return -1;
                k += 17 + (size_t)total;
            }
        } else if (m == 0xDD) {
            if (slen < 2) return -1;
            j->restart = (s[0] << 8) | s[1];
        } else if (m == 0xDA) {
            if (!have_sof || slen < 1) return -1;
            int ns = s[0];
            if (ns != j->ncomp || slen < 1 + 2 * (size_t)ns + 3) return -1;
            int hmax = 1, vmax = 1;
            for (int c = 0; c < ns; c++) {
                int cs = s[1 + 2 * c], which = -1;
                for (int q = 0; q < j->ncomp; q++)
                    if (ids[q] == cs) which = q;
                if (which < 0) return -1;
                j->h[c] = sof_h[which];
                j->v[c] = sof_v[which];
                j->dc_tbl[c] = s[2 + 2 * c] >> 4;
                j->ac_tbl[c] = s[2 + 2 * c] & 15;
                if (j->dc_tbl[c] > 3 || j->ac_tbl[c] > 3) return -1;
                if (!j->dc[j->dc_tbl[c]].defined || !j->ac[j->ac_tbl[c]].defined) return -1;
                if (j->h[c] > hmax) hmax = j->h[c];
                if (j->v[c] > vmax) vmax = j->v[c];
            }
            const uint8_t *tail = s + 1 + 2 * ns;
            if (tail[0] != 0 || tail[1] != 63 || tail[2] != 0) return -1;
            if (ns == 1 && (j->h[0] != 1 || j->v[0] != 1)) return -1;
            j->mcu_w = 8 * hmax;
            j->mcu_h = 8 * vmax;
            j->mcus_per_row = (j->width + j->mcu_w - 1) / j->mcu_w;
            j->mcu_rows = (j->height + j->mcu_h - 1) / j->mcu_h;
            if (j->restart % j->mcus_per_row) return -1; /* a restart inside an MCU row: not indexed */
            j->sos_start = pos - 2;
            j->data_start = pos + len;
            return 0;
        }
        pos += len;
    }
    return -1;
}

/* The entropy-coded data without its 0xFF00 stuffing and its restart markers (each interval stays byte-aligned),
 * up to the first other marker, then PAD zero bytes. */
static uint8_t *unstuff(const uint8_t *d, size_t n, size_t start, size_t *out_len) {
    uint8_t *u = (uint8_t *)malloc(n - start + PAD);
    if (u == NULL) return NULL;
    size_t i = start, o = 0;
    while (i < n) {
        const uint8_t *ff = (const uint8_t *)memchr(d + i, 0xFF, n - i);
        size_t stop = ff ? (size_t)(ff - d) : n;
        memcpy(u + o, d + i, stop - i);
        o += stop - i;
        i = stop;
        if (ff == NULL || i + 1 >= n) break;
        if (d[i + 1] >= 0xD0 && d[i + 1] <= 0xD7) { /* RSTn: dropped */
            i += 2;
            continue;
        }
        if (d[i + 1] != 0x00) break;
        u[o++] = 0xFF;
        i += 2;
    }
    memset(u + o, 0, PAD);
    *out_len = o;
    return u;
}

static inline uint64_t peek64(const uint8_t *u, uint64_t p) {
    uint64_t w;
    memcpy(&w, u + (p >> 3), 8);
    return __builtin_bswap64(w) << (p & 7);
}

static inline int extend(uint32_t v, int s) { return v < (1u << (s - 1)) ? (int)v - (1 << s) + 1 : (int)v; }

static void put_u16(uint8_t *o, int v) {
    o[0] = (uint8_t)(v & 0xFF);
    o[1] = (uint8_t)((v >> 8) & 0xFF);
}

static int get_u16(const uint8_t *o) { return o[0] | (o[1] << 8); }

/* Entries of one MCU row with one every k MCUs, and the bytes of a whole index. */
static size_t per_row(int mcus_per_row, int k) { return ((size_t)mcus_per_row + (size_t)k - 1) / (size_t)k; }

static size_t index_bytes(const jinfo *j, int k) {
    return HEADER_BYTES + ((size_t)j->mcu_rows * per_row(j->mcus_per_row, k) + 1) * ENTRY_BYTES;
}

/* The 8x8 blocks of the whole scan. */
static size_t blocks(const jinfo *j) {
    size_t per_mcu = 0;
    for (int c = 0; c < j->ncomp; c++) per_mcu += (size_t)(j->h[c] * j->v[c]);
    return per_mcu * (size_t)j->mcus_per_row * (size_t)j->mcu_rows;
}

/* The Huffman parse (nothing kept but the DC differences), for the index's walk and crop_jpeg alike: from a 64-bit
 * buffer of the next bits topped up without a branch before each code (reads 8 bytes at most past what it counts:
 * PAD covers them), and one table lookup per AC coefficient for its code and value bits together (1.3-1.4x as fast
 * on photos as a lookup per symbol from the bit position; the same entries on ~15,000 whole, cut and damaged files).
 * walk_mcu: one MCU's blocks, -1 past the stream or on a bad code. */
typedef struct {
    uint64_t buf;        /* the next bits, first at the top (below cnt: zero, or the stream's next bits) */
    int cnt;             /* how many of buf's bits are the stream's */
    const uint8_t *next; /* the first byte not yet in buf */
    const uint8_t *u;
} breader;

static inline void br_seek(breader *b, const uint8_t *u, uint64_t p) {
    uint64_t w;
    memcpy(&w, u + (p >> 3), 8);
    b->u = u;
    b->next = u + (p >> 3) + 7; /* 7 bytes counted: cnt stays below 64 (the 8th's bits are the stream's too) */
    b->buf = __builtin_bswap64(w) << (p & 7);
    b->cnt = 56 - (int)(p & 7);
}

static inline uint64_t br_pos(const breader *b) { return (uint64_t)(b->next - b->u) * 8 - (uint64_t)b->cnt; }

static inline void br_fill(breader *b) { /* at least 56 bits in buf afterwards */
    uint64_t w;
    memcpy(&w, b->next, 8);
    b->buf |= __builtin_bswap64(w) >> b->cnt;
    b->next += (63 - b->cnt) >> 3;
    b->cnt |= 56;
}

static inline void br_skip(breader *b, int n) {
    b->buf <<= n;
    b->cnt -= n;
}

/* A code longer than 9 bits (the buffer holds >= 32): its symbol, or -1. */
static inline int br_long(const htable *t, breader *b) {
    for (int l = 10; l <= 16; l++) {
        int32_t c = (int32_t)(b->buf >> (64 - l));
        if (c <= t->maxcode[l]) {
            br_skip(b, l);
            return t->vals[t->valoff[l] + c];
        }
    }
    return -1;
}

/* A block's DC difference (through diff): -1 on a code the table lacks or a category over 11. */
static inline int walk_dc(const htable *dct, breader *b, int *diff) {
    br_fill(b);
    unsigned e = dct->lut[b->buf >> 55];
    int s;
    if (e >> 8) {
        br_skip(b, (int)(e >> 8));
        s = (int)(e & 0xFF);
    } else if ((s = br_long(dct, b)) < 0) {
        return -1;
    }
    if (s > 11) return -1;
    *diff = 0;
    if (s) {
        *diff = extend((uint32_t)(b->buf >> (64 - s)), s);
        br_skip(b, s);
    }
    return 0;
}

/* A block's AC coefficients, skipped: -1 on a code the table lacks. */
static inline int walk_ac(const htable *act, breader *b) {
    for (int k = 1; k < 64;) {
        br_fill(b);
        unsigned sk = act->skip[b->buf >> 55];
        if (sk) {
            br_skip(b, (int)(sk & 31));
            if (sk & SKIP_END) break;
            k += (int)((sk >> 5) & 31);
            continue;
        }
        int rs = br_long(act, b);
        if (rs < 0) return -1;
        int r = rs >> 4, size = rs & 15;
        if (size) {
            br_skip(b, size);
            k += r + 1;
        } else {
            if (r != 15) break;
            k += 16;
        }
    }
    return 0;
}

static inline int walk_block(const htable *dct, const htable *act, breader *b, int *diff) {
    return walk_dc(dct, b, diff) || walk_ac(act, b) ? -1 : 0;
}

static inline int walk_mcu(const jinfo *j, breader *b, int *dc, uint64_t limit) {
    for (int c = 0; c < j->ncomp; c++) {
        const htable *dct = &j->dc[j->dc_tbl[c]], *act = &j->ac[j->ac_tbl[c]];
        for (int k = 0; k < j->h[c] * j->v[c]; k++) {
            int diff;
            if (walk_block(dct, act, b, &diff) || br_pos(b) > limit) return -1;
            dc[c] += diff;
        }
    }
    return 0;
}

/* The hash of an index's entries and of its geometry (MCUs per row, rows, MCU size, K): a K changed to another
 * with as many entries per row would misplace every entry, so it is refused like a damaged entry. */
static uint64_t entries_hash(const uint8_t *ix, size_t ixlen) {
    uint64_t geometry;
    memcpy(&geometry, ix + 4, 8);
    return file_hash(ix + HEADER_BYTES, ixlen - HEADER_BYTES) ^ mix64(geometry + 0x9E3779B97F4A7C15ull);
}

/* entropy_index(data, max_fraction=0.015, every=0, min_bytes_per_block=0) -> bytes | None. every > 0: an entry
 * every that many MCUs of a row; 0: the fewest MCUs per entry that keep the index within max_fraction of len(data)
 * (at least one entry per MCU row, whatever that costs). None also where the entropy-coded data holds fewer than
 * min_bytes_per_block bytes per 8x8 block: flat content or a low quality, whose entropy decoding is too cheap for
 * an index to pay for its fixed cost per crop. */
PyObject *entropy_index(PyObject *self, PyObject *args) {
    Py_buffer data;
    double max_fraction = 0.015, min_bytes_per_block = 0;
    int every = 0;
    if (!PyArg_ParseTuple(args, "y*|did", &data, &max_fraction, &every, &min_bytes_per_block)) return NULL;
    if (every < 0 || !(max_fraction > 0)) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "entropy_index: every must be >= 0 and max_fraction > 0");
        return NULL;
    }
    const uint8_t *d = (const uint8_t *)data.buf;
    size_t n = (size_t)data.len;
    jinfo j;
    uint8_t *u = NULL, *out = NULL;
    size_t ulen = 0, size = 0;
    int ok = 0, nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    if (parse(d, n, &j) == 0 && (u = unstuff(d, n, j.data_start, &ulen)) != NULL &&
        (double)ulen >= min_bytes_per_block * (double)blocks(&j)) {
        int k = every ? every : 1;
        if (!every)
            while (k < j.mcus_per_row && (double)index_bytes(&j, k) > max_fraction * (double)n) k++;
        if (k > j.mcus_per_row) k = j.mcus_per_row;
        size_t total = (size_t)j.mcus_per_row * (size_t)j.mcu_rows, epr = per_row(j.mcus_per_row, k);
        uint64_t limit = (uint64_t)ulen * 8;
        size = index_bytes(&j, k);
        out = (uint8_t *)malloc(size);
        if (out == NULL) {
            nomem = 1;
        } else if (limit < ((uint64_t)1 << 32) && n < ((size_t)1 << 32) && k < 65536) {
            memcpy(out, "FDX3", 4);
            put_u16(out + 4, j.mcus_per_row);
            put_u16(out + 6, j.mcu_rows);
            out[8] = (uint8_t)j.mcu_w;
            out[9] = (uint8_t)j.mcu_h;
            put_u16(out + 10, k);
            uint32_t len32 = (uint32_t)n;
            uint64_t hash = file_hash(d, n);
            memcpy(out + 12, &len32, 4);
            memcpy(out + 16, &hash, 8);
            breader b;
            br_seek(&b, u, 0);
            int dc[MAX_COMP] = {0, 0, 0};
            ok = 1;
            for (size_t m = 0; m <= total && ok; m++) {
                if (j.restart && m && m < total && m % (size_t)j.restart == 0) {
                    br_seek(&b, u, (br_pos(&b) + 7) & ~(uint64_t)7); /* a new interval: byte-aligned */
                    dc[0] = dc[1] = dc[2] = 0;                        /* predictors zero */
                }
                size_t row = m / (size_t)j.mcus_per_row, col = m % (size_t)j.mcus_per_row;
                if (m == total || col % (size_t)k == 0) {
                    uint8_t *e = out + HEADER_BYTES + (m == total ? j.mcu_rows * epr : row * epr + col / k) * ENTRY_BYTES;
                    uint32_t bp = (uint32_t)br_pos(&b);
                    memcpy(e, &bp, 4);
                    for (int c = 0; c < MAX_COMP; c++) {
                        int16_t v = (int16_t)(c < j.ncomp ? dc[c] : 0);
                        memcpy(e + 4 + 2 * c, &v, 2);
                    }
                }
                if (m < total && walk_mcu(&j, &b, dc, limit)) ok = 0;
            }
        }
    }
    if (ok) {
        uint64_t entries = entries_hash(out, size);
        memcpy(out + 24, &entries, 8);
    }
    free(u);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (nomem) return PyErr_NoMemory();
    if (!ok) {
        free(out);
        Py_RETURN_NONE;
    }
    PyObject *result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)size);
    free(out);
    return result;
}

typedef struct {
    uint8_t *o;
    size_t n;
    uint64_t acc;
    int nb;
} bitwriter;

static inline void put_bits(bitwriter *w, uint32_t v, int s) {
    if (s == 0) return;
    w->acc = (w->acc << s) | (v & (uint32_t)((1ull << s) - 1));
    w->nb += s;
    if (w->nb >= 32) {
        uint32_t word = (uint32_t)(w->acc >> (w->nb - 32));
        uint32_t x = ~word; /* a byte of word is 0xFF where a byte of x is zero */
        if (!((x - 0x01010101u) & ~x & 0x80808080u)) {
            uint32_t be = __builtin_bswap32(word);
            memcpy(w->o + w->n, &be, 4);
            w->n += 4;
            w->nb -= 32;
        }
    }
    while (w->nb >= 8) {
        w->nb -= 8;
        uint8_t b = (uint8_t)(w->acc >> w->nb);
        w->o[w->n++] = b;
        if (b == 0xFF) w->o[w->n++] = 0;
    }
}

static inline void pad_ones(bitwriter *w) {
    if (w->nb) put_bits(w, 0x7F, 8 - w->nb);
}

static void copy_bits(bitwriter *w, const uint8_t *u, uint64_t a, uint64_t b) {
    while (w->nb && a < b) { /* bring the writer to a byte boundary */
        int s = 8 - w->nb;
        if ((uint64_t)s > b - a) s = (int)(b - a);
        put_bits(w, (uint32_t)(peek64(u, a) >> (64 - s)), s);
        a += (uint64_t)s;
    }
    int shift = (int)(a & 7);
    while (b - a >= 64) { /* eight bytes at a time, shifted out of the source; stuffed only where one is 0xFF */
        const uint8_t *src = u + (a >> 3);
        uint64_t word;
        memcpy(&word, src, 8);
        word = __builtin_bswap64(word);
        if (shift) word = (word << shift) | (uint64_t)(src[8] >> (8 - shift));
        uint64_t x = ~word;
        if (!((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull)) {
            uint64_t be = __builtin_bswap64(word);
            memcpy(w->o + w->n, &be, 8);
            w->n += 8;
        } else {
            for (int k = 56; k >= 0; k -= 8) {
                uint8_t byte = (uint8_t)(word >> k);
                w->o[w->n++] = byte;
                if (byte == 0xFF) w->o[w->n++] = 0;
            }
        }
        a += 64;
    }
    while (a < b) {
        int s = b - a < 32 ? (int)(b - a) : 32;
        put_bits(w, (uint32_t)(peek64(u, a) >> (64 - s)), s);
        a += (uint64_t)s;
    }
}

static void read_entry(const uint8_t *index, size_t m, entry *e) {
    const uint8_t *p = index + HEADER_BYTES + m * ENTRY_BYTES;
    memcpy(&e->bitpos, p, 4);
    memcpy(e->dc, p + 4, 2 * MAX_COMP);
}

static int same_file(const uint8_t *ix, size_t ixlen, const uint8_t *d, size_t n) {
    uint32_t len32;
    uint64_t hash, entries;
    memcpy(&len32, ix + 12, 4);
    memcpy(&hash, ix + 16, 8);
    memcpy(&entries, ix + 24, 8);
    return len32 == (uint32_t)n && hash == file_hash(d, n) && entries == entries_hash(ix, ixlen);
}

/* Where MCU col of row r starts (bit offset) and the DC predictors there: from the entry at or before it, parsing
 * the MCUs in between (at most K - 1). -1: the stream ends first. */
static int reach(const jinfo *j, const uint8_t *ix, int k, int r, int col, uint64_t limit, const uint8_t *u,
                 uint64_t *p, int *dc) {
    entry e;
    read_entry(ix, (size_t)r * per_row(j->mcus_per_row, k) + (size_t)(col / k), &e);
    *p = e.bitpos;
    for (int c = 0; c < MAX_COMP; c++) dc[c] = e.dc[c];
    if (*p > limit) return -1;
    breader b;
    br_seek(&b, u, *p);
    for (int m = (col / k) * k; m < col; m++)
        if (walk_mcu(j, &b, dc, limit)) return -1;
    *p = br_pos(&b);
    return 0;
}

/* Where the bits copied for MCUs [.., col) of row r may end: the next entry at or after col (the next row's first
 * past the row's end). The MCUs between col and it are copied too, unparsed: the decoder reads the row's
 * restart interval of (col1 - col0) MCUs and skips what is left before the restart marker (libjpeg's "extraneous
 * data", a warning), which costs a byte scan instead of a Huffman parse. */
static uint64_t row_end(const jinfo *j, const uint8_t *ix, int k, int r, int col) {
    size_t epr = per_row(j->mcus_per_row, k), g = ((size_t)col + (size_t)k - 1) / (size_t)k;
    entry e;
    read_entry(ix, g * (size_t)k < (size_t)j->mcus_per_row ? (size_t)r * epr + g : (size_t)(r + 1) * epr, &e);
    return e.bitpos;
}

/* crop_jpeg(data, index, row0, row1, col0, col1) -> bytes | None: the MCUs [row0, row1) x [col0, col1). */
PyObject *crop_jpeg(PyObject *self, PyObject *args) {
    Py_buffer data, index;
    int r0, r1, c0, c1;
    if (!PyArg_ParseTuple(args, "y*y*iiii", &data, &index, &r0, &r1, &c0, &c1)) return NULL;
    const uint8_t *d = (const uint8_t *)data.buf, *ix = (const uint8_t *)index.buf;
    size_t n = (size_t)data.len;
    jinfo j;
    uint8_t *u = NULL;
    size_t ulen = 0;
    uint64_t *spans = NULL; /* per row: start, end */
    int *dcs = NULL;        /* per row: the predictors at its first MCU */
    bitwriter w = {NULL, 0, 0, 0};
    int k = index.len >= HEADER_BYTES ? get_u16(ix + 10) : 0;
    int status = 0; /* 0 ok, 1 not possible (None), 2 bad arguments, 3 no memory, 4 another file's index */
    Py_BEGIN_ALLOW_THREADS
    if (parse(d, n, &j) != 0) {
        status = 1;
    } else if (index.len < HEADER_BYTES || memcmp(ix, "FDX3", 4) != 0) {
        status = 2;
    } else if (!same_file(ix, (size_t)index.len, d, n)) {
        status = 4;
    } else if (get_u16(ix + 4) != j.mcus_per_row || get_u16(ix + 6) != j.mcu_rows || ix[8] != j.mcu_w ||
               ix[9] != j.mcu_h || k < 1 || k > j.mcus_per_row || (size_t)index.len != index_bytes(&j, k) ||
               r0 < 0 || r0 >= r1 || r1 > j.mcu_rows || c0 < 0 || c0 >= c1 || c1 > j.mcus_per_row) {
        status = 2;
    } else if ((u = unstuff(d, n, j.data_start, &ulen)) == NULL ||
               (spans = (uint64_t *)malloc(2 * sizeof(uint64_t) * (size_t)(r1 - r0))) == NULL ||
               (dcs = (int *)malloc(MAX_COMP * sizeof(int) * (size_t)(r1 - r0))) == NULL) {
        status = 3;
    } else {
        uint64_t limit = (uint64_t)ulen * 8;
        size_t bits = 0;
        for (int r = r0; r < r1 && status == 0; r++) {
            uint64_t *span = spans + 2 * (r - r0);
            if (reach(&j, ix, k, r, c0, limit, u, &span[0], dcs + MAX_COMP * (r - r0))) {
                status = 1;
                break;
            }
            span[1] = row_end(&j, ix, k, r, c1);
            if (span[1] < span[0] || span[1] > limit) status = 1;
            else bits += span[1] - span[0];
        }
        size_t cap = j.data_start + 6 + 2 * (bits / 8 + (size_t)(r1 - r0) * 16) + 64;
        if (status == 0 && (w.o = (uint8_t *)malloc(cap)) == NULL) status = 3;
        if (status == 0) {
            int height = (r1 * j.mcu_h < j.height ? r1 * j.mcu_h : j.height) - r0 * j.mcu_h;
            int width = (c1 * j.mcu_w < j.width ? c1 * j.mcu_w : j.width) - c0 * j.mcu_w;
            memcpy(w.o, d, j.sos_start); /* a DRI of the original's is overridden by ours, written after it */
            w.o[j.sof_dims] = (uint8_t)(height >> 8);
            w.o[j.sof_dims + 1] = (uint8_t)height;
            w.o[j.sof_dims + 2] = (uint8_t)(width >> 8);
            w.o[j.sof_dims + 3] = (uint8_t)width;
            w.n = j.sos_start;
            const uint8_t dri[6] = {0xFF, 0xDD, 0x00, 0x04, (uint8_t)((c1 - c0) >> 8), (uint8_t)(c1 - c0)};
            memcpy(w.o + w.n, dri, 6);
            w.n += 6;
            memcpy(w.o + w.n, d + j.sos_start, j.data_start - j.sos_start);
            w.n += j.data_start - j.sos_start;
            for (int r = r0; r < r1 && status == 0; r++) {
                uint64_t p = spans[2 * (r - r0)], end = spans[2 * (r - r0) + 1];
                const int *dc = dcs + MAX_COMP * (r - r0);
                /* The row's first MCU: each component's first DC difference re-encoded against a zero predictor
                 * (a restart resets it); everything else copied bit for bit. */
                for (int c = 0; c < j.ncomp && status == 0; c++) {
                    const htable *dct = &j.dc[j.dc_tbl[c]];
                    const htable *act = &j.ac[j.ac_tbl[c]];
                    for (int blk = 0; blk < j.h[c] * j.v[c]; blk++) {
                        uint64_t q = p;
                        breader b;
                        br_seek(&b, u, p);
                        int diff;
                        if (walk_dc(dct, &b, &diff)) {
                            status = 1;
                            break;
                        }
                        if (blk == 0) {
                            int value = dc[c] + diff, mag = value < 0 ? -value : value, cat = 0;
                            while (mag >> cat) cat++;
                            if (cat > 11 || !dct->size[cat]) {
                                status = 1; /* this file's DC table has no code for it */
                                break;
                            }
                            put_bits(&w, dct->code[cat], dct->size[cat]);
                            put_bits(&w, (uint32_t)(value < 0 ? value - 1 : value), cat);
                            q = br_pos(&b); /* the AC coefficients follow, copied */
                        }
                        if (walk_ac(act, &b)) status = 1;
                        p = br_pos(&b);
                        if (status || p > end) {
                            status = 1;
                            break;
                        }
                        copy_bits(&w, u, q, p);
                    }
                }
                if (status) break;
                copy_bits(&w, u, p, end);
                pad_ones(&w);
                if (r + 1 < r1) {
                    w.o[w.n++] = 0xFF;
                    w.o[w.n++] = (uint8_t)(0xD0 + ((r - r0) & 7));
                }
            }
            w.o[w.n++] = 0xFF;
            w.o[w.n++] = 0xD9;
        }
    }
    free(u);
    free(spans);
    free(dcs);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&index);
    if (status == 3) {
        free(w.o);
        return PyErr_NoMemory();
    }
    if (status == 2) {
        free(w.o);
        PyErr_SetString(PyExc_ValueError, "crop_jpeg: the index does not belong to this image or the MCU box is outside it");
        return NULL;
    }
    if (status == 4) {
        PyErr_SetString(PyExc_KeyError, "crop_jpeg: the index was built from other bytes (the file changed) or is damaged");
        return NULL;
    }
    if (status == 1) {
        free(w.o);
        Py_RETURN_NONE;
    }
    PyObject *result = PyBytes_FromStringAndSize((const char *)w.o, (Py_ssize_t)w.n);
    free(w.o);
    return result;
}
