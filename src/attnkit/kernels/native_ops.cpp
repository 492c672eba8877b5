// attnkit's compiled torch ops: built on first use by attnkit.kernels._native_ops,
// loaded with torch.ops.load_library. Only what a compiled graph runs per call is here;
// everything rare calls back into the Python ops of the same namespace.
//
// attnkit::sdpa_settled(q, k, v, is_causal, scale, gqa, flash) -> out
//   torch's SDPA on the CPU, then one read of its output: every value finite and no row
//   all zeros shows that the kernel gave the non-finite policy's answer (the argument is
//   in attnkit.backends.sdpa.run.kernel_followed_policy). Otherwise the Python op
//   attnkit::sdpa_settle decides from the same output, and recomputes where it must.
//   flash: torch's own choice for these inputs, asked when the graph was traced, is its
//   CPU flash kernel, which is then called directly (as compiled SDPA does), without
//   SDPA's choice per call. q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev);
//   out (B, H, L, Ev), row-major.

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#if defined(__AVX512BW__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// True when every value of the R rows of C values (bit patterns of one float format) is
// finite and each row holds a value other than +-0: no value has its exponent field all
// ones, and no row's magnitudes OR to zero. Plain loops, which compilers vectorize with
// the oldest vector instructions (an unsigned maximum would need newer ones).
template <typename Bits>
bool rows_settled_scalar(const Bits* rows, int64_t R, int64_t C, Bits magnitude, Bits exponent) {
    for (int64_t r = 0; r < R; ++r) {
        const Bits* row = rows + r * C;
        Bits any = 0;
        Bits bad = 0;
        for (int64_t c = 0; c < C; ++c) {
            any |= static_cast<Bits>(row[c] & magnitude);
            bad |= static_cast<Bits>((row[c] & exponent) == exponent);
        }
        if (any == 0 || bad != 0) return false;
    }
    return true;
}

#if defined(__AVX512BW__) || defined(__AVX2__)
// The same read in vector registers (compilers do not vectorize the test of each row
// well: they reduce its lanes one by one). Per row: the OR of its vectors, tested with
// one instruction, and the lane-wise maximum carried on to the next row.
#if defined(__AVX512BW__)
using Vec = __m512i;
inline Vec load(const void* p) { return _mm512_loadu_si512(p); }
inline Vec bits_and(Vec a, Vec b) { return _mm512_and_si512(a, b); }
inline Vec bits_or(Vec a, Vec b) { return _mm512_or_si512(a, b); }
inline Vec max_u32(Vec a, Vec b) { return _mm512_max_epu32(a, b); }
inline Vec max_u16(Vec a, Vec b) { return _mm512_max_epu16(a, b); }
inline bool is_zero(Vec a) { return _mm512_test_epi32_mask(a, a) == 0; }
inline Vec broadcast_u32(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
inline Vec zero() { return _mm512_setzero_si512(); }
inline void store(void* p, Vec a) { _mm512_storeu_si512(p, a); }
#else
using Vec = __m256i;
inline Vec load(const void* p) { return _mm256_loadu_si256(static_cast<const Vec*>(p)); }
inline Vec bits_and(Vec a, Vec b) { return _mm256_and_si256(a, b); }
inline Vec bits_or(Vec a, Vec b) { return _mm256_or_si256(a, b); }
inline Vec max_u32(Vec a, Vec b) { return _mm256_max_epu32(a, b); }
inline Vec max_u16(Vec a, Vec b) { return _mm256_max_epu16(a, b); }
inline bool is_zero(Vec a) { return _mm256_testz_si256(a, a) != 0; }
inline Vec broadcast_u32(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
inline Vec zero() { return _mm256_setzero_si256(); }
inline void store(void* p, Vec a) { _mm256_storeu_si256(static_cast<Vec*>(p), a); }
#endif

template <typename Bits>
bool rows_settled(const Bits* rows, int64_t R, int64_t C, Bits magnitude, Bits exponent) {
    constexpr int64_t W = sizeof(Vec) / sizeof(Bits);  // values per vector
    const int64_t whole = C - C % W;
    if (whole == 0) return rows_settled_scalar(rows, R, C, magnitude, exponent);
    const uint32_t pattern =
        sizeof(Bits) == 4 ? uint32_t(magnitude) : (uint32_t(magnitude) << 16 | magnitude);
    const Vec mag = broadcast_u32(pattern);
    Vec top = zero();
    Bits tail_top = 0;
    for (int64_t r = 0; r < R; ++r) {
        const Bits* row = rows + r * C;
        Vec any = zero();
        for (int64_t c = 0; c < whole; c += W) {
            const Vec u = bits_and(load(row + c), mag);
            any = bits_or(any, u);
            top = sizeof(Bits) == 4 ? max_u32(top, u) : max_u16(top, u);
        }
        Bits tail_any = 0;
        for (int64_t c = whole; c < C; ++c) {
            const Bits u = static_cast<Bits>(row[c] & magnitude);
            tail_any |= u;
            tail_top = u > tail_top ? u : tail_top;
        }
        if (is_zero(any) && tail_any == 0) return false;
    }
    Bits lanes[W];
    store(lanes, top);
    for (int64_t j = 0; j < W; ++j) tail_top = lanes[j] > tail_top ? lanes[j] : tail_top;
    return tail_top < exponent;
}
#else
template <typename Bits>
bool rows_settled(const Bits* rows, int64_t R, int64_t C, Bits magnitude, Bits exponent) {
    return rows_settled_scalar(rows, R, C, magnitude, exponent);
}
#endif

bool settled(const at::Tensor& out) {
    const int64_t C = out.size(-1);
    const int64_t n = out.numel();
    if (C == 0 || n == 0) return false;
    const void* data = out.const_data_ptr();
    switch (out.scalar_type()) {
        case at::kFloat:
            return rows_settled<uint32_t>(static_cast<const uint32_t*>(data), n / C, C,
                                          0x7fffffffu, 0x7f800000u);
        case at::kHalf:
            return rows_settled<uint16_t>(static_cast<const uint16_t*>(data), n / C, C,
                                          0x7fff, 0x7c00);
        case at::kBFloat16:
            return rows_settled<uint16_t>(static_cast<const uint16_t*>(data), n / C, C,
                                          0x7fff, 0x7f80);
        default:
            return false;  // float64: the Python op reads it
    }
}

at::Tensor sdpa_settled(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        bool is_causal, double scale, bool gqa, bool flash) {
    // (the choice was made for row-major inputs: SDPA's flash kernel wants unit last strides)
    flash = flash && q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1;
    at::Tensor out;
    {
        // The op runs without gradient (a traced call takes it only then), so torch's
        // kernel is reached below autograd, without the bookkeeping of its wrapper.
        at::AutoDispatchBelowADInplaceOrView below_autograd;
        // row-major, as the op's fake kernel says: a compiled graph asserts its strides
        out = (flash ? std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
                           q, k, v, 0.0, is_causal, std::nullopt, scale))
                     : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, is_causal,
                                                        scale, gqa))
                  .contiguous();  // (B, H, L, Ev)
    }
    if (settled(out)) return out;
    static auto settle =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("attnkit::sdpa_settle", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, bool, double, bool)>();
    return settle.call(out, q, k, v, is_causal, scale, gqa);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnkit, m) {
    m.def("sdpa_settled(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool gqa, bool flash) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnkit, CPU, m) { m.impl("sdpa_settled", sdpa_settled); }
