/* attnkit's native CPU kernels: a vectorized exp over logits rows, the additive
   score's fused add-tanh-dot loop with its gradients, and a one-pass check of a kernel's
   output rows. Built on first use by
   attnkit/kernels/_native.py with the system C compiler; includes no torch headers.
   AVX2+FMA paths where the compiler targets them (AVX-512 too for the additive loops),
   portable scalar loops elsewhere. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define AK_AVX2 1
#if defined(__AVX512F__)
#define AK_AVX512 1
#endif
#endif

/* tanh(x) = sign(x) * t with u = expm1(2|x|), |x| clamped to AK_TANH_SAT, and t = u / (u + 2)
   up to |x| = atanh(1/2), 1 - 2 / (u + 2) above: a relative error of a few float32 roundings
   near 0, and within 0.65 ulps from |x| = 1.5 (half an ulp plus the rounding of the small
   term 2 / (u + 2)). (1 - 2/(exp(2x) + 1) everywhere has an absolute error of eps, a relative
   one of eps / |x| near 0 (6e-5 at x = 1e-3); u / (u + 2) everywhere rounds u + 2 and the
   quotient on tanh itself, 1.5 ulps near 1. Additive logits are sums of such terms times
   the scale: at logits of 3e4, one ulp of a term is a tenth of a unit of the softmax's
   argument, and it moved the weights of near-tied keys by 19 times plain float32's error.)
   Scalar form, same formula as the vector ones. */
#define AK_TANH_HALF 0.5493061443f
/* Beyond this |x| float32 tanh is exactly ±1: 1 - tanh(10) = 4e-9 is under half an ulp (at 9,
   1 - 2 / (u + 2) would round to one ulp below 1). */
#define AK_TANH_SAT 10.0f

static inline float ak_tanh1(float x) {
    float a = fabsf(x) > AK_TANH_SAT ? AK_TANH_SAT : fabsf(x);
    float u = expm1f(2.0f * a);
    float q = 1.0f / (u + 2.0f);
    float t = a > AK_TANH_HALF ? 1.0f - 2.0f * q : u * q;
    return copysignf(t, x);
}

/* e^r - 1 = r (1 + C1 r + ... + C5 r^5) for |r| <= ln2/2, the additive loops' expm1: a
   near-minimax fit of (e^r - 1) / r, relative error 2.3e-8 (a fifth of eps), one term
   shorter than the Taylor polynomial of ak_exp8_poly; with the one-step reduction below it
   pays for tanh's select. */
/* ln 2 rounded to float32 (1.9e-9 above it), for the additive loops' one-step reduction
   r = y - n ln2: with y <= 2 AK_TANH_SAT, n <= 29, so r is off by at most 5.5e-8, and u by
   that relative share where n is large, where it reaches tanh damped by 1 - tanh. */
#define AK_LN2F 0.693147182464599609375f
#define AK_EM1_C1 4.999999702e-01f
#define AK_EM1_C2 1.666650474e-01f
#define AK_EM1_C3 4.166712239e-02f
#define AK_EM1_C4 8.369279094e-03f
#define AK_EM1_C5 1.389020821e-03f

#ifdef AK_AVX2
/* e^r for y = n*ln2 + r, |r| <= ln2/2, by its degree-7 Taylor polynomial; n in *n_out. */
static inline __m256 ak_exp8_poly(__m256 y, __m256i* n_out) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), y);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    *n_out = _mm256_cvtps_epi32(n);
    return p;
}

/* exp(y) for y in [-87, 89]. 2^n is applied as two factors 2^(n/2) * 2^(n - n/2), so
   n up to 129 overflows to +inf exactly where expf does instead of wrapping the exponent. */
static inline __m256 ak_exp8_inner(__m256 y) {
    __m256i ni;
    __m256 p = ak_exp8_poly(y, &ni);
    __m256i half = _mm256_srai_epi32(ni, 1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 two_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
    __m256 two_b = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, two_a), two_b);
}

/* exp(x) for any x: 0 below -87 (and for -inf), +inf above ln(FLT_MAX) (and for +inf),
   NaN for NaN. min/max return their second operand when either is NaN, so x goes second. */
static inline __m256 ak_exp8(__m256 x) {
    __m256 dead = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    __m256 y = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));
    return _mm256_andnot_ps(dead, ak_exp8_inner(y));
}

/* expm1(y) for 0 <= y <= 2 AK_TANH_SAT: 2^n (e^r - 1) + (2^n - 1), e^r - 1 = r q(r) with q
   the fit above (accurate in relative terms near 0). */
static inline __m256 ak_expm1_8(__m256 y) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(y, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(AK_LN2F), y);
    __m256 p = _mm256_set1_ps(AK_EM1_C5);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(AK_EM1_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(AK_EM1_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(AK_EM1_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(AK_EM1_C1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256 em1r = _mm256_mul_ps(p, r);  /* e^r - 1 */
    __m256 two_n = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
    return _mm256_fmadd_ps(two_n, em1r, _mm256_sub_ps(two_n, _mm256_set1_ps(1.0f)));
}

/* tanh as ak_tanh1: u = expm1(2 min(|x|, AK_TANH_SAT)), q = 1 / (u + 2), t = u q or
   1 - 2 q; NaN stays NaN (min returns it, the comparison is false). */
static inline __m256 ak_tanh8(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_min_ps(_mm256_set1_ps(AK_TANH_SAT), _mm256_andnot_ps(sign, x));
    __m256 u = ak_expm1_8(_mm256_add_ps(a, a));
    const __m256 two = _mm256_set1_ps(2.0f);
    __m256 big = _mm256_cmp_ps(a, _mm256_set1_ps(AK_TANH_HALF), _CMP_GT_OQ);
    __m256 q = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(u, two));
    __m256 t = _mm256_blendv_ps(_mm256_mul_ps(u, q),
                                _mm256_fnmadd_ps(two, q, _mm256_set1_ps(1.0f)), big);
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

static inline float ak_hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_hadd_ps(lo, lo);
    lo = _mm_hadd_ps(lo, lo);
    return _mm_cvtss_f32(lo);
}

/* The smallest and the largest of eight floats, reduced by SSE's min and max (a NaN lane
   is passed on or dropped by its place, as those instructions do). */
static inline float ak_hmin8(__m256 v) {
    __m128 h = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_min_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_min_ss(h, _mm_shuffle_ps(h, h, 1)));
}

static inline float ak_hmax8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}
#endif

#ifdef AK_AVX512
/* The 16-wide form of ak_expm1_8 and ak_tanh8 (same polynomial, same clamp), for the
   additive score's hot loop where the CPU has AVX-512. */
static inline __m512 ak_tanh16(__m512 x) {
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x),
                                          _mm512_set1_epi32((int)0x80000000u));
    __m512 a = _mm512_min_ps(_mm512_set1_ps(AK_TANH_SAT), _mm512_abs_ps(x));
    __m512 y = _mm512_add_ps(a, a);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(y, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(AK_LN2F), y);
    __m512 p = _mm512_set1_ps(AK_EM1_C5);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(AK_EM1_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(AK_EM1_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(AK_EM1_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(AK_EM1_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 em1r = _mm512_mul_ps(p, r);  /* e^r - 1 */
    __m512 two_n = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
    __m512 u = _mm512_fmadd_ps(two_n, em1r, _mm512_sub_ps(two_n, _mm512_set1_ps(1.0f)));
    const __m512 two = _mm512_set1_ps(2.0f);
    __mmask16 big = _mm512_cmp_ps_mask(a, _mm512_set1_ps(AK_TANH_HALF), _CMP_GT_OQ);
    __m512 q = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(u, two));
    __m512 t = _mm512_mask_blend_ps(big, _mm512_mul_ps(u, q),
                                    _mm512_fnmadd_ps(two, q, _mm512_set1_ps(1.0f)));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sign));
}
#endif

/* s[r, c] = exp(s[r, c] - shift[r]) in place for R rows of C; exp(-inf) = 0. With rowsum
   != NULL also rowsum[r] = sum_c of the new s[r, c]. */
/* exp(x) of one float as ak_exp8 gives it: 0 below -87 (and for -inf). */
static inline float ak_exp1(float x) { return x < -87.0f ? 0.0f : expf(x); }

void ak_exp_rows(float* s, const float* shift, float* rowsum, int64_t R, int64_t C,
                 int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < R; ++r) {
        float* row = s + r * C;
        const float sh = shift[r];
        float acc = 0.0f;
        int64_t c = 0;
#ifdef AK_AVX2
        __m256 acc8 = _mm256_setzero_ps();
        const __m256 sh8 = _mm256_set1_ps(sh);
        for (; c + 8 <= C; c += 8) {
            __m256 e = ak_exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c), sh8));
            _mm256_storeu_ps(row + c, e);
            acc8 = _mm256_add_ps(acc8, e);
        }
        acc = ak_hsum8(acc8);
#endif
        for (; c < C; ++c) {
            row[c] = ak_exp1(row[c] - sh);
            acc += row[c];
        }
        if (rowsum) rowsum[r] = acc;
    }
}

/* ak_exp_rows with what a row's entropy needs, in the same pass: s[r, :] becomes
   e = exp(s[r, :] - shift[r]), rowsum[r] = sum e, rowpx[r] = sum e * (s - shift) (a key of
   e = 0, a blocked -inf among them, adds 0) and rowpos[r] = the count of e > 0. */
void ak_exp_rows_entropy(float* s, const float* shift, float* rowsum, float* rowpx,
                         float* rowpos, int64_t R, int64_t C, int nthreads) {
    #pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < R; ++r) {
        float* row = s + r * C;
        const float sh = shift[r];
        float acc = 0.0f, px = 0.0f, pos = 0.0f;
        int64_t c = 0;
#ifdef AK_AVX2
        __m256 acc8 = _mm256_setzero_ps(), px8 = _mm256_setzero_ps();
        __m256 pos8 = _mm256_setzero_ps();
        const __m256 sh8 = _mm256_set1_ps(sh), floor8 = _mm256_set1_ps(-88.0f);
        const __m256 zero8 = _mm256_setzero_ps(), one8 = _mm256_set1_ps(1.0f);
        for (; c + 8 <= C; c += 8) {
            __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + c), sh8);
            __m256 e = ak_exp8(x);
            _mm256_storeu_ps(row + c, e);
            acc8 = _mm256_add_ps(acc8, e);
            /* e is 0 below -87: the floor keeps 0 * -inf out of the product */
            px8 = _mm256_fmadd_ps(e, _mm256_max_ps(x, floor8), px8);
            pos8 = _mm256_add_ps(pos8, _mm256_and_ps(_mm256_cmp_ps(e, zero8, _CMP_GT_OQ), one8));
        }
        acc = ak_hsum8(acc8);
        px = ak_hsum8(px8);
        pos = ak_hsum8(pos8);
#endif
        for (; c < C; ++c) {
            float x = row[c] - sh, e = ak_exp1(x);
            row[c] = e;
            acc += e;
            if (e > 0.0f) {
                px += e * x;
                pos += 1.0f;
            }
        }
        rowsum[r] = acc;
        rowpx[r] = px;
        rowpos[r] = pos;
    }
}

/* Slots a row's top-k keeps in vector registers: up to this k, the kept values and keys
   lie in 16 slots, those past k holding +inf at key -1 (never the smallest while a real
   slot is, nor among equals: the latest key wins a tie). */
#define AK_TOPK_SLOTS 16

#ifdef AK_AVX2
/* The slot of the smallest of 16 values v (the latest key ix among equals; ix NULL: any
   of them), its value in *out. No value is NaN. */
static inline int64_t ak_min_slot16(const float* v, const int64_t* ix, float* out) {
    __m256 a = _mm256_loadu_ps(v), b = _mm256_loadu_ps(v + 8);
    float least = ak_hmin8(_mm256_min_ps(a, b));
    __m256 l8 = _mm256_set1_ps(least);
    unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, l8, _CMP_EQ_OQ)) |
                    (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(b, l8, _CMP_EQ_OQ)) << 8;
    int64_t slot = __builtin_ctz(bits);
    bits &= bits - 1;
    while (ix && bits) { /* equal values (-0 and +0 among them): the latest key */
        int j = __builtin_ctz(bits);
        bits &= bits - 1;
        if (ix[j] > ix[slot]) slot = j;
    }
    *out = least;
    return slot;
}
#endif

/* Put y at key c into the slot of the smallest kept value, then find the new smallest
   (the latest key among equals): one step of ak_row_topk's top-k. Returns its value. With
   k <= AK_TOPK_SLOTS under AVX2, v and ix hold AK_TOPK_SLOTS slots (see there). */
static inline float ak_topk_take(float* v, int64_t* ix, int64_t k, int64_t* lo, float y,
                                 int64_t c) {
    v[*lo] = y;
    ix[*lo] = c;
#ifdef AK_AVX2
    if (k <= AK_TOPK_SLOTS) {
        float least;
        *lo = ak_min_slot16(v, ix, &least);
        return least;
    }
#endif
    int64_t m = 0;
    for (int64_t j = 1; j < k; ++j)
        if (v[j] < v[m] || (v[j] == v[m] && ix[j] > ix[m])) m = j;
    *lo = m;
    return v[m];
}

#ifdef AK_AVX2
/* Keys per group of ak_row_topk's first pass: eight vectors, whose lane-wise max holds the
   max of eight disjoint sets of keys (lane j: keys j, j + 8, ..., j + 56 of the group). */
#define AK_TOPK_GROUP 64

/* The k-th largest of x[0 .. n) (n >= k, no NaN), with tmp holding max(k, 16) floats: the
   same replace-the-smallest scan as the top-k itself, over values only. */
static float ak_kth_largest(const float* x, int64_t n, int64_t k, float* tmp) {
    memcpy(tmp, x, (size_t)k * sizeof(float));
    for (int64_t j = k; j < AK_TOPK_SLOTS; ++j)
        tmp[j] = INFINITY;
    int64_t lo = 0;
    for (int64_t j = 1; j < k; ++j)
        if (tmp[j] < tmp[lo]) lo = j;
    float thr = tmp[lo];
    for (int64_t c = k; c < n; ++c) {
        if (c + 8 <= n && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + c),
                                                            _mm256_set1_ps(thr), _CMP_GT_OQ))) {
            c += 7; /* none of these eight */
            continue;
        }
        if (!(x[c] > thr)) continue;
        tmp[lo] = x[c];
        if (k <= AK_TOPK_SLOTS) {
            lo = ak_min_slot16(tmp, NULL, &thr);
            continue;
        }
        for (int64_t j = 0; j < k; ++j)
            if (tmp[j] < tmp[lo]) lo = j;
        thr = tmp[lo];
    }
    return thr;
}

/* One step of the top-k's scan over keys u .. u + 7 of a row: each key above thr (the
   smallest kept value) and at least t0 takes the smallest's slot, in key order. Returns
   the new thr. A NaN key is never taken. */
static inline float ak_topk_scan8(const float* row, int64_t u, __m256 t0, float thr, float* v,
                                  int64_t* ix, int64_t k, int64_t* lo) {
    __m256 x = _mm256_loadu_ps(row + u);
    int bits = _mm256_movemask_ps(_mm256_and_ps(
        _mm256_cmp_ps(x, _mm256_set1_ps(thr), _CMP_GT_OQ), _mm256_cmp_ps(x, t0, _CMP_GE_OQ)));
    while (bits) {
        int lane = __builtin_ctz(bits);
        bits &= bits - 1;
        float y = row[u + lane];
        if (!(y > thr)) continue; /* thr rose within these eight */
        thr = ak_topk_take(v, ix, k, lo, y, u + lane);
    }
    return thr;
}

/* The lane maxima of G groups of AK_TOPK_GROUP keys from x into work[0 .. 8G) (each the
   max of eight of the group's keys; a NaN key leaves it as it was), and a bound t0 at most
   the k-th largest key (8G >= k): the k-th largest of eight groups' maxima in turn (each
   the max of 64 keys) where there are k of those, else of the groups' own. Any k disjoint
   sets of keys whose maxima are >= t0 hold k keys >= t0. work holds 9G + k + 16 floats. */
static float ak_topk_bound(const float* x, int64_t G, int64_t k, float* work) {
    for (int64_t g = 0; g < G; ++g) {
        const float* keys = x + g * AK_TOPK_GROUP;
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (int t = 0; t < 8; ++t)
            m = _mm256_max_ps(_mm256_loadu_ps(keys + 8 * t), m);
        _mm256_storeu_ps(work + 8 * g, m);
    }
    int64_t G8 = G / 8;
    float* wide = work + 8 * G; /* (G8, 8): the max over eight groups' lanes */
    for (int64_t g = 0; g < G8; ++g) {
        __m256 m = _mm256_loadu_ps(work + 64 * g);
        for (int t = 1; t < 8; ++t)
            m = _mm256_max_ps(_mm256_loadu_ps(work + 64 * g + 8 * t), m);
        _mm256_storeu_ps(wide + 8 * g, m);
    }
    float* tmp = wide + 8 * G8;
    if (8 * G8 >= k)
        return ak_kth_largest(wide, 8 * G8, k, tmp);
    return ak_kth_largest(work, 8 * G, k, tmp);
}
#endif

/* The k largest of each row of w (R, S), exact: vals[r, :k] largest first (equal values:
   the lower key first) and their keys idx[r, :k]. A row of fewer than k keys is padded with
   weight 0 at keys S .. k - 1. NaN is never chosen. With bmax and bsum, also each row's max
   and sum over every b keys, bmax[r, :nb] and bsum[r, :nb] (nb = ceil(S / b); the last
   block may be short), read while the row is in cache.

   The scan keeps the k best keys seen and replaces the smallest when a larger value comes.
   With vectors, a first pass bounds the row's k-th largest value from below by t0
   (ak_topk_bound). A key below t0 is never among the k, and a group of 64 keys whose lane
   maxima are all below t0, or at most the scan's smallest kept value, is skipped whole:
   the scan visits a superset of the answer's keys, in key order, so it keeps exactly the
   answer, its ties broken as a scan of every key breaks them. On peaked rows of 8,000
   keys this halved the kernel's time: far fewer replacements. */
void ak_row_topk(const float* w, int64_t R, int64_t S, int64_t k, int64_t b, float* vals,
                 int64_t* idx, float* bmax, float* bsum, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
#ifdef AK_AVX2
        /* per thread: ak_topk_bound's work */
        float* gmax = (float*)malloc(
            (size_t)(S / AK_TOPK_GROUP * 9 + k + AK_TOPK_SLOTS) * sizeof(float));
#endif
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; ++r) {
            const float* row = w + r * S;
            float* v = vals + r * k;
            int64_t* ix = idx + r * k;
#ifdef AK_AVX2
            float slot_v[AK_TOPK_SLOTS];
            int64_t slot_ix[AK_TOPK_SLOTS];
            if (k <= AK_TOPK_SLOTS) { /* the kept values in registers' reach; copied out below */
                v = slot_v;
                ix = slot_ix;
                for (int64_t j = k; j < AK_TOPK_SLOTS; ++j) {
                    v[j] = INFINITY;
                    ix[j] = -1;
                }
            }
#endif
            int64_t n = S < k ? S : k;
            for (int64_t j = 0; j < n; ++j) {
                v[j] = row[j] == row[j] ? row[j] : -1.0f; /* a NaN is never chosen */
                ix[j] = j;
            }
            for (int64_t j = n; j < k; ++j) {
                v[j] = 0.0f;
                ix[j] = j;
            }
            /* the slot of the smallest kept value (the latest key among equals), its value */
            int64_t lo = 0;
            for (int64_t j = 1; j < k; ++j)
                if (v[j] < v[lo] || (v[j] == v[lo] && ix[j] > ix[lo])) lo = j;
            float thr = v[lo];
            int64_t c = n;
#ifdef AK_AVX2
            /* the whole groups of keys after the first k */
            int64_t G = gmax ? (S - n) / AK_TOPK_GROUP : 0;
            if (G * 8 >= k) {
                const __m256 t0 = _mm256_set1_ps(ak_topk_bound(row + n, G, k, gmax));
                for (int64_t g = 0; g < G; ++g, c += AK_TOPK_GROUP) {
                    __m256 m = _mm256_loadu_ps(gmax + 8 * g);
                    if (!_mm256_movemask_ps(_mm256_and_ps(
                            _mm256_cmp_ps(m, _mm256_set1_ps(thr), _CMP_GT_OQ),
                            _mm256_cmp_ps(m, t0, _CMP_GE_OQ))))
                        continue; /* no key here is taken */
                    for (int64_t u = c; u < c + AK_TOPK_GROUP; u += 8)
                        thr = ak_topk_scan8(row, u, t0, thr, v, ix, k, &lo);
                }
            }
            for (; c + 8 <= S; c += 8) /* the keys after the last whole group */
                thr = ak_topk_scan8(row, c, _mm256_set1_ps(-INFINITY), thr, v, ix, k, &lo);
#endif
            for (; c < S; ++c) {
                float y = row[c];
                if (!(y > thr)) continue;
                thr = ak_topk_take(v, ix, k, &lo, y, c);
            }
            /* largest first, equal values by key: an insertion sort of k entries */
            for (int64_t j = 1; j < k; ++j) {
                float y = v[j];
                int64_t iy = ix[j];
                int64_t t = j - 1;
                while (t >= 0 && (v[t] < y || (v[t] == y && ix[t] > iy))) {
                    v[t + 1] = v[t];
                    ix[t + 1] = ix[t];
                    --t;
                }
                v[t + 1] = y;
                ix[t + 1] = iy;
            }
            if (v != vals + r * k) {
                memcpy(vals + r * k, v, (size_t)k * sizeof(float));
                memcpy(idx + r * k, ix, (size_t)k * sizeof(int64_t));
            }
            if (bmax && bsum) {
                int64_t nb = (S + b - 1) / b;
                float* out = bmax + r * nb;
                float* tot = bsum + r * nb;
                for (int64_t q = 0; q < nb; ++q) {
                    int64_t a = q * b, e = a + b < S ? a + b : S;
                    float m = row[a], t = 0.0f;
                    int64_t j = a;
#ifdef AK_AVX2
                    if (e - a >= 16) {
                        __m256 m8 = _mm256_loadu_ps(row + a), t8 = _mm256_setzero_ps();
                        for (; j + 8 <= e; j += 8) {
                            __m256 x = _mm256_loadu_ps(row + j);
                            m8 = _mm256_max_ps(m8, x);
                            t8 = _mm256_add_ps(t8, x);
                        }
                        m = ak_hmax8(m8);
                        t = ak_hsum8(t8);
                    }
#endif
                    for (; j < e; ++j) {
                        m = row[j] > m ? row[j] : m;
                        t += row[j];
                    }
                    out[q] = m;
                    tot[q] = t;
                }
            }
        }
#ifdef AK_AVX2
        free(gmax);
#endif
    }
}

/* 1 when every value of the R rows of C floats at p is finite and every row holds a
   value other than +-0, else 0: one read, stopping at the first row that fails. The floats
   are `bytes` wide (4: float32; 2: float16 or bfloat16) with the exponent field
   `exp_mask` (0x7f800000, 0x7c00 or 0x7f80): a value is inf or NaN when its bits without
   the sign are at least the mask. Written as plain loops the compiler vectorizes. */
int ak_rows_settled(const void* p, int64_t R, int64_t C, int bytes, uint32_t exp_mask) {
    if (bytes == 4) {
        const uint32_t* rows = (const uint32_t*)p;
        for (int64_t r = 0; r < R; ++r) {
            const uint32_t* row = rows + r * C;
            uint32_t any = 0, bad = 0;
            for (int64_t c = 0; c < C; ++c) {
                uint32_t u = row[c] & 0x7fffffffu;
                any |= u;
                bad |= (uint32_t)(u >= exp_mask);
            }
            if (bad || !any) return 0;
        }
        return 1;
    }
    if (bytes == 2) {
        const uint16_t* rows = (const uint16_t*)p;
        uint16_t m = (uint16_t)exp_mask;
        for (int64_t r = 0; r < R; ++r) {
            const uint16_t* row = rows + r * C;
            uint16_t any = 0, bad = 0;
            for (int64_t c = 0; c < C; ++c) {
                uint16_t u = (uint16_t)(row[c] & 0x7fffu);
                any |= u;
                bad |= (uint16_t)(u >= m);
            }
            if (bad || !any) return 0;
        }
        return 1;
    }
    return 0;
}

/* Identifies this library to its loader: a file at the cache path that does not answer
   with the expected tag is not loaded as attnkit's. */
int ak_abi_tag(void) { return 20261129; }

/* Which hand-vectorized loops were compiled: 0 none (portable scalar loops), 1 AVX2+FMA,
   2 AVX2+FMA and AVX-512 for the additive score's loops. */
int ak_simd_level(void) {
#if defined(AK_AVX512)
    return 2;
#elif defined(AK_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* out[r, i, j] = sum_h w[h] * tanh(qh[r, i, h] + kh[r, j, h]); all row-major, contiguous. */
void ak_additive_logits(const float* qh, const float* kh, const float* w, float* out,
                        int64_t R, int64_t M, int64_t N, int64_t H, int nthreads) {
    #pragma omp parallel for collapse(2) num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < R; ++r)
        for (int64_t i = 0; i < M; ++i) {
            const float* a = qh + (r * M + i) * H;
            float* o = out + (r * M + i) * N;
            for (int64_t j = 0; j < N; ++j) {
                const float* b = kh + (r * N + j) * H;
                float acc = 0.0f;
                int64_t h = 0;
#ifdef AK_AVX512
                __m512 acc16 = _mm512_setzero_ps();
                for (; h + 16 <= H; h += 16) {
                    __m512 t = ak_tanh16(_mm512_add_ps(_mm512_loadu_ps(a + h),
                                                       _mm512_loadu_ps(b + h)));
                    acc16 = _mm512_fmadd_ps(_mm512_loadu_ps(w + h), t, acc16);
                }
                acc = _mm512_reduce_add_ps(acc16);
#endif
#ifdef AK_AVX2
                __m256 acc8 = _mm256_setzero_ps();
                for (; h + 8 <= H; h += 8) {
                    __m256 t = ak_tanh8(_mm256_add_ps(_mm256_loadu_ps(a + h),
                                                      _mm256_loadu_ps(b + h)));
                    acc8 = _mm256_fmadd_ps(_mm256_loadu_ps(w + h), t, acc8);
                }
                acc += ak_hsum8(acc8);
#endif
                for (; h < H; ++h) acc += w[h] * ak_tanh1(a[h] + b[h]);
                o[j] = acc;
            }
        }
}

/* Gradients of the logits above given g[r, i, j] = dLoss/dout[r, i, j]:
     dqh[r, i, :] = sum_j g * w * (1 - t^2),   dkh_t[thread, r, j, :] += g * w * (1 - t^2),
     dw_t[thread, :] += g * t,                  t = tanh(qh[r, i, :] + kh[r, j, :]).
   dqh is written; dkh_t (nthreads, R, N, H) and dw_t (nthreads, H) must be zeroed and are
   summed over threads by the caller. Pairs with g == 0 (masked, skipped) cost nothing. */
void ak_additive_grads(const float* qh, const float* kh, const float* w, const float* g,
                       float* dqh, float* dkh_t, float* dw_t,
                       int64_t R, int64_t M, int64_t N, int64_t H, int nthreads) {
    #pragma omp parallel num_threads(nthreads)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float* dk_mine = dkh_t + (int64_t)tid * R * N * H;
        float* dw_mine = dw_t + (int64_t)tid * H;
        #pragma omp for collapse(2) schedule(static)
        for (int64_t r = 0; r < R; ++r)
            for (int64_t i = 0; i < M; ++i) {
                const float* a = qh + (r * M + i) * H;
                const float* gr = g + (r * M + i) * N;
                float* dq = dqh + (r * M + i) * H;
                for (int64_t h = 0; h < H; ++h) dq[h] = 0.0f;
                for (int64_t j = 0; j < N; ++j) {
                    float gij = gr[j];
                    if (gij == 0.0f) continue;
                    const float* b = kh + (r * N + j) * H;
                    float* dk = dk_mine + (r * N + j) * H;
                    int64_t h = 0;
#ifdef AK_AVX512
                    __m512 g16 = _mm512_set1_ps(gij);
                    __m512 one16 = _mm512_set1_ps(1.0f);
                    for (; h + 16 <= H; h += 16) {
                        __m512 t = ak_tanh16(_mm512_add_ps(_mm512_loadu_ps(a + h),
                                                           _mm512_loadu_ps(b + h)));
                        __m512 gw = _mm512_mul_ps(g16, _mm512_loadu_ps(w + h));
                        __m512 d = _mm512_mul_ps(gw, _mm512_fnmadd_ps(t, t, one16));
                        _mm512_storeu_ps(dq + h, _mm512_add_ps(_mm512_loadu_ps(dq + h), d));
                        _mm512_storeu_ps(dk + h, _mm512_add_ps(_mm512_loadu_ps(dk + h), d));
                        _mm512_storeu_ps(dw_mine + h,
                                         _mm512_fmadd_ps(g16, t, _mm512_loadu_ps(dw_mine + h)));
                    }
#endif
#ifdef AK_AVX2
                    __m256 g8 = _mm256_set1_ps(gij);
                    __m256 one = _mm256_set1_ps(1.0f);
                    for (; h + 8 <= H; h += 8) {
                        __m256 t = ak_tanh8(_mm256_add_ps(_mm256_loadu_ps(a + h),
                                                          _mm256_loadu_ps(b + h)));
                        __m256 gw = _mm256_mul_ps(g8, _mm256_loadu_ps(w + h));
                        __m256 d = _mm256_mul_ps(gw, _mm256_fnmadd_ps(t, t, one));
                        _mm256_storeu_ps(dq + h, _mm256_add_ps(_mm256_loadu_ps(dq + h), d));
                        _mm256_storeu_ps(dk + h, _mm256_add_ps(_mm256_loadu_ps(dk + h), d));
                        _mm256_storeu_ps(dw_mine + h,
                                         _mm256_fmadd_ps(g8, t, _mm256_loadu_ps(dw_mine + h)));
                    }
#endif
                    for (; h < H; ++h) {
                        float t = ak_tanh1(a[h] + b[h]);
                        float d = gij * w[h] * (1.0f - t * t);
                        dq[h] += d;
                        dk[h] += d;
                        dw_mine[h] += gij * t;
                    }
                }
            }
    }
}
