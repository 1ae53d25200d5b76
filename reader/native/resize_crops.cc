// ImagerecordsResizeCrops: a batch of variable-size uint8 RGB crops -> one
// float32 [B, H, W, 3] batch, resized (bilinear) and optionally mirrored, written
// straight into the batch. With T=uint8 each value is rounded (half to even, as
// tf.round) and saturated into a uint8 batch: a quarter of the bytes to write.
//
// Why a custom op: with stock TensorFlow ops every image of a batch is cast to
// float32, resized into its own [H, W, 3] tensor, and then copied into the batch
// (TensorArray.stack). At 224x224 the copy alone moves 600 KB per image, and
// the cast and a separate flip touch the pixels twice more. Here each output
// row is written once, where it belongs in the batch.
//
// The arithmetic is tf.image.resize(method="bilinear", antialias=False) on a
// float32 input (ResizeBilinear with half_pixel_centers=True,
// align_corners=False) of the crop, mirrored first when asked: the same sample
// positions, the same clamping at the edges and the same order of float
// operations (top = tl + (tr - tl) * xl; bottom = ...; top + (bottom - top) *
// yl), computed separably: each input row is interpolated horizontally once,
// then two such rows are blended per output row. Built with -ffp-contract=off
// so no compiler fuses a multiply-add that TensorFlow's kernel does not.
//
// Built on first use by reader/native.py against the installed TensorFlow.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define IMAGERECORDS_AVX2 1
#endif

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/kernels/tensor_list.h"
#include "tensorflow/core/lib/random/philox_random.h"
#include "tensorflow/core/lib/random/random_distributions_utils.h"
#include "tensorflow/core/util/work_sharder.h"

namespace imagerecords {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorList;
using ::tensorflow::TensorShape;
using ::tensorflow::Variant;
namespace shape_inference = ::tensorflow::shape_inference;

absl::Status ResizeCropsShape(shape_inference::InferenceContext* c) {
  std::vector<int32_t> size;
  TF_RETURN_IF_ERROR(c->GetAttr("size", &size));
  shape_inference::ShapeHandle shapes;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &shapes));
  c->set_output(0, c->MakeShape({c->Dim(shapes, 0), size[0], size[1], 3}));
  return absl::OkStatus();
}

REGISTER_OP("ImagerecordsResizeCrops")
    .Input("pixels: uint8")   // [N]: the crops' HWC bytes one after the other, or
                              // [B, L]: crop i in row i (padded_batch), L >= its bytes
    .Input("shapes: int32")   // [B, 2]: (height, width) of each crop
    .Input("flips: bool")     // [B]: mirror left-right
    .Attr("size: list(int) >= 2")
    .Attr("T: {float, uint8} = DT_FLOAT")
    .Output("images: T")  // [B, size[0], size[1], 3], values 0..255
    .SetShapeFn(ResizeCropsShape);

// The same, reading the crops where a decode loop left them: a TensorList (a
// TensorArray's flow in a tf.function) whose element i holds crop i's HWC bytes.
// Saves concatenating the windows into one tensor first (a copy of every
// decoded byte).
REGISTER_OP("ImagerecordsResizeCropList")
    .Input("crops: variant")  // scalar TensorList of uint8 tensors, B elements
    .Input("shapes: int32")
    .Input("flips: bool")
    .Attr("size: list(int) >= 2")
    .Attr("T: {float, uint8} = DT_FLOAT")
    .Output("images: T")
    .SetShapeFn(ResizeCropsShape);

// ImagerecordsFlipDraws: reader.decode.flip_draw (tf.random.stateless_uniform([],
// seed) < 0.5) for a whole batch of seeds in one op, the same draws: on the CPU
// stateless_uniform's default algorithm is Philox, keyed by
// StatelessRandomGetKeyCounter's scramble of the seed (one Philox round from a
// fixed key), and its value is the first 32-bit output made a float in [0, 1).
// Replaces ~6 ops per image inside the training decode loop.
REGISTER_OP("ImagerecordsFlipDraws")
    .Input("seeds: int64")  // [B, 2]: each image's flip seed
    .Output("flips: bool")  // [B]
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle seeds;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &seeds));
      c->set_output(0, c->Vector(c->Dim(seeds, 0)));
      return absl::OkStatus();
    });

namespace {

class FlipDrawsOp : public OpKernel {
 public:
  using OpKernel::OpKernel;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& seeds = ctx->input(0);
    OP_REQUIRES(ctx, seeds.dims() == 2 && seeds.dim_size(1) == 2,
                absl::InvalidArgumentError("seeds must be [B, 2]"));
    const auto seed = seeds.matrix<int64_t>();
    Tensor* flips = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({seeds.dim_size(0)}), &flips));
    auto flip = flips->vec<bool>();
    using ::tensorflow::random::PhiloxRandom;
    for (int64_t i = 0; i < seeds.dim_size(0); ++i) {
      // GenerateKey (stateless_random_ops.cc): the seed scrambled into a key and
      // counter by one Philox round.
      const uint64_t s0 = static_cast<uint64_t>(seed(i, 0));
      const uint64_t s1 = static_cast<uint64_t>(seed(i, 1));
      PhiloxRandom::Key key;
      PhiloxRandom::ResultType counter;
      key[0] = 0x3ec8f720;
      key[1] = 0x02461e29;
      counter[0] = static_cast<uint32_t>(s0);
      counter[1] = static_cast<uint32_t>(s0 >> 32);
      counter[2] = static_cast<uint32_t>(s1);
      counter[3] = static_cast<uint32_t>(s1 >> 32);
      const PhiloxRandom::ResultType mix = PhiloxRandom(counter, key)();
      key[0] = mix[0];
      key[1] = mix[1];
      counter[0] = counter[1] = 0;
      counter[2] = mix[2];
      counter[3] = mix[3];
      // StatelessRandomUniformV2 of shape []: the first output of the first group.
      const float uniform = ::tensorflow::random::Uint32ToFloat(PhiloxRandom(counter, key)()[0]);
      flip(i) = uniform * 1.0f + 0.0f < 0.5f;  // rnd * (maxval - minval) + minval < 0.5
    }
  }
};

// One value of a blend, as TensorFlow's kernel computes it: lo + (hi - lo) * lerp
// (no fused multiply-add: the library is built with -ffp-contract=off).
inline float Lerp(float lo, float hi, float lerp) { return lo + (hi - lo) * lerp; }

// A float result as the uint8 batch holds it: rounded half to even (SSE's
// default rounding mode, and std::nearbyint's) and saturated, i.e.
// tf.saturate_cast(tf.round(value), tf.uint8).
inline uint8_t RoundToByte(float value) {
  return static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, std::nearbyint(value))));
}

struct Tap {
  int64_t lower;  // index of the first input sample (already x3 for columns)
  int64_t upper;
  float lerp;
};

// tf's compute_interpolation_weights with HalfPixelScaler, for one axis.
void ComputeTaps(int64_t out_size, int64_t in_size, int64_t stride, std::vector<Tap>* taps) {
  const float scale = in_size / static_cast<float>(out_size);
  taps->resize(out_size);
  for (int64_t i = 0; i < out_size; ++i) {
    const float in = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float in_f = std::floor(in);
    Tap& t = (*taps)[i];
    t.lower = std::max(static_cast<int64_t>(in_f), static_cast<int64_t>(0)) * stride;
    t.upper = std::min(static_cast<int64_t>(std::ceil(in)), in_size - 1) * stride;
    t.lerp = in - in_f;
  }
}

// One input row interpolated horizontally to the output width (x3 channels).
// The row is first widened to float in one vectorisable pass, so the taps read
// floats (each input value is converted once, not once per tap using it).
// With SSE2 each output pixel is one 4-lane load of its lower and upper input
// pixels (the 4th lane is the next pixel's first channel, or padding) and one
// 4-lane store, which the next pixel's store partly overwrites: the same three
// float operations per channel as the scalar loop, so the same bits. Needs 4
// readable floats at every tap and 1 writable float past the row's end.
void HorizontalRow(const uint8_t* __restrict row, int64_t row_len, const std::vector<Tap>& xs,
                   float* __restrict widened, float* __restrict out) {
  for (int64_t k = 0; k < row_len; ++k) widened[k] = static_cast<float>(row[k]);
  const int64_t width = static_cast<int64_t>(xs.size());
  const Tap* taps = xs.data();
#if defined(__SSE2__)
  for (int64_t x = 0; x < width; ++x) {
    const Tap& t = taps[x];
    const __m128 lo = _mm_loadu_ps(widened + t.lower);
    const __m128 hi = _mm_loadu_ps(widened + t.upper);
    _mm_storeu_ps(out + 3 * x, _mm_add_ps(lo, _mm_mul_ps(_mm_sub_ps(hi, lo), _mm_set1_ps(t.lerp))));
  }
#else
  for (int64_t x = 0; x < width; ++x) {
    const Tap& t = taps[x];
    const float* lo = widened + t.lower;
    const float* hi = widened + t.upper;
    const float lerp = t.lerp;
    out[3 * x + 0] = Lerp(lo[0], hi[0], lerp);
    out[3 * x + 1] = Lerp(lo[1], hi[1], lerp);
    out[3 * x + 2] = Lerp(lo[2], hi[2], lerp);
  }
#endif
}

// A crop that already has the output size: every tap has lerp 0 and lower ==
// upper, so the bilinear value is the input value itself (v + (v - v) * 0 ==
// v), i.e. a cast, mirrored when asked. Done directly, without the two passes.
// (The evaluation centre crop of a 256 px record is exactly 224 x 224.)
void CastRow(const uint8_t* __restrict row, int64_t width, bool flip, float* __restrict dst) {
  if (!flip) {
    int64_t k = 0;
    const int64_t len = 3 * width;
#if defined(__SSE2__)
    for (; k < len && (reinterpret_cast<uintptr_t>(dst + k) & 15) != 0; ++k) {
      dst[k] = static_cast<float>(row[k]);
    }
    const __m128i zero = _mm_setzero_si128();
    for (; k + 16 <= len; k += 16) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
      const __m128i lo16 = _mm_unpacklo_epi8(bytes, zero);
      const __m128i hi16 = _mm_unpackhi_epi8(bytes, zero);
      _mm_stream_ps(dst + k, _mm_cvtepi32_ps(_mm_unpacklo_epi16(lo16, zero)));
      _mm_stream_ps(dst + k + 4, _mm_cvtepi32_ps(_mm_unpackhi_epi16(lo16, zero)));
      _mm_stream_ps(dst + k + 8, _mm_cvtepi32_ps(_mm_unpacklo_epi16(hi16, zero)));
      _mm_stream_ps(dst + k + 12, _mm_cvtepi32_ps(_mm_unpackhi_epi16(hi16, zero)));
    }
#endif
    for (; k < len; ++k) dst[k] = static_cast<float>(row[k]);
    return;
  }
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t* src = row + 3 * (width - 1 - x);
    dst[3 * x + 0] = static_cast<float>(src[0]);
    dst[3 * x + 1] = static_cast<float>(src[1]);
    dst[3 * x + 2] = static_cast<float>(src[2]);
  }
}

void CastRow(const uint8_t* __restrict row, int64_t width, bool flip, uint8_t* __restrict dst) {
  if (!flip) {
    // Streamed, as the float32 rows and the blends are: memcpy's plain stores
    // read every destination line of the batch first (op alone on 224 px
    // crops, one thread: 0.045 -> 0.021-0.027 ms per image).
    int64_t k = 0;
    const int64_t len = 3 * width;
#if defined(__SSE2__)
    for (; k < len && (reinterpret_cast<uintptr_t>(dst + k) & 15) != 0; ++k) dst[k] = row[k];
    for (; k + 16 <= len; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
    }
#endif
    std::memcpy(dst + k, row + k, len - k);
    return;
  }
  for (int64_t x = 0; x < width; ++x) {
    const uint8_t* src = row + 3 * (width - 1 - x);
    dst[3 * x + 0] = src[0];
    dst[3 * x + 1] = src[1];
    dst[3 * x + 2] = src[2];
  }
}

// dst = top + (bottom - top) * lerp. A batch (128 x 600 KB at 224 px) is far
// larger than the caches and is read next by someone else, so on x86 the rows
// are written with non-temporal stores: no read of the destination lines
// before writing them, which on the benchmark cut the op's time by a quarter.
// Same float operations in the same order as the scalar loop: same bits.
void BlendRows(const float* __restrict top, const float* __restrict bottom, float lerp,
               int64_t len, float* __restrict dst) {
  int64_t k = 0;
#if defined(__SSE2__)
  for (; k < len && (reinterpret_cast<uintptr_t>(dst + k) & 15) != 0; ++k) {
    dst[k] = Lerp(top[k], bottom[k], lerp);
  }
  const __m128 lerp4 = _mm_set1_ps(lerp);
  for (; k + 4 <= len; k += 4) {
    const __m128 t = _mm_loadu_ps(top + k);
    const __m128 b = _mm_loadu_ps(bottom + k);
    _mm_stream_ps(dst + k, _mm_add_ps(t, _mm_mul_ps(_mm_sub_ps(b, t), lerp4)));
  }
#endif
  for (; k < len; ++k) {
    dst[k] = Lerp(top[k], bottom[k], lerp);
  }
}

// The uint8 batch: the same float value as BlendRows, RoundToByte'd (cvtps2dq
// rounds half to even in the default mode, the packs saturate).
void BlendRows(const float* __restrict top, const float* __restrict bottom, float lerp,
               int64_t len, uint8_t* __restrict dst) {
  int64_t k = 0;
#if defined(__SSE2__)
  const __m128 lerp4 = _mm_set1_ps(lerp);
  for (; k + 16 <= len; k += 16) {
    __m128i q[4];
    for (int j = 0; j < 4; ++j) {
      const __m128 t = _mm_loadu_ps(top + k + 4 * j);
      const __m128 b = _mm_loadu_ps(bottom + k + 4 * j);
      q[j] = _mm_cvtps_epi32(_mm_add_ps(t, _mm_mul_ps(_mm_sub_ps(b, t), lerp4)));
    }
    const __m128i lo = _mm_packs_epi32(q[0], q[1]);
    const __m128i hi = _mm_packs_epi32(q[2], q[3]);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + k), _mm_packus_epi16(lo, hi));
  }
#endif
  for (; k < len; ++k) {
    dst[k] = RoundToByte(Lerp(top[k], bottom[k], lerp));
  }
}

#if defined(IMAGERECORDS_AVX2)
// AVX2 versions, chosen at run time (the library is built without -mavx2 so that
// it runs on any x86-64). The same float operations on the same values in the
// same order, twice as many lanes per instruction, and no fused multiply-add
// (the "avx2" target does not include FMA): the same bits. The horizontal pass
// is compute-bound, so it gains; the blend is bound by writing the batch and
// gains little.
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// One input row, as HorizontalRow, two output pixels per 8-lane operation.
// lerp4[4 * x + j] = xs[x].lerp for j < 4, so pixels x and x+1 take one load.
__attribute__((target("avx2"))) void HorizontalRowAvx2(const uint8_t* __restrict row,
                                                       int64_t row_len,
                                                       const std::vector<Tap>& xs,
                                                       const float* __restrict lerp4,
                                                       float* __restrict widened,
                                                       float* __restrict out) {
  for (int64_t k = 0; k < row_len; ++k) widened[k] = static_cast<float>(row[k]);
  const int64_t width = static_cast<int64_t>(xs.size());
  const Tap* taps = xs.data();
  // Lanes 0-2: pixel x, 4-6: pixel x+1; moved to 0-2 and 3-5, then one store of
  // 8 floats whose last two the next store overwrites (2 floats of padding).
  const __m256i pack = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);
  int64_t x = 0;
  for (; x + 2 <= width; x += 2) {
    const Tap& a = taps[x];
    const Tap& b = taps[x + 1];
    const __m256 lo = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(widened + a.lower)),
                                           _mm_loadu_ps(widened + b.lower), 1);
    const __m256 hi = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(widened + a.upper)),
                                           _mm_loadu_ps(widened + b.upper), 1);
    const __m256 lerp = _mm256_loadu_ps(lerp4 + 4 * x);
    const __m256 v = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_sub_ps(hi, lo), lerp));
    _mm256_storeu_ps(out + 3 * x, _mm256_permutevar8x32_ps(v, pack));
  }
  for (; x < width; ++x) {
    const Tap& t = taps[x];
    const __m128 lo = _mm_loadu_ps(widened + t.lower);
    const __m128 hi = _mm_loadu_ps(widened + t.upper);
    _mm_storeu_ps(out + 3 * x, _mm_add_ps(lo, _mm_mul_ps(_mm_sub_ps(hi, lo), _mm_set1_ps(t.lerp))));
  }
}

// The horizontal pass with the gather done on bytes: output values are taken 8
// at a time (x3 channels laid end to end, so 8 values span 2-3 pixels); when
// the input bytes all 8 read (their lower and upper samples) lie within 16
// consecutive bytes of the row, one 16-byte load and two byte shuffles (lower,
// upper) fetch them, and the arithmetic runs on 8 contiguous values, stored
// without overlap. The same float operations on the same values as
// HorizontalRow (each byte widened exactly to float, then lo + (hi - lo) *
// lerp): the same bits. Without the per-row widening pass and the per-pixel
// loads and permutes, it does about half the work per value (op alone: 0.126
// -> 0.086 ms per training image, then 0.121 -> 0.114 for the shuffles that
// widen too; docs/performance.md, "The native resize op").
//
// Crops up to about 3.3x the output width (downscaled crops of larger records)
// take the same pass with a 32-byte window: two 16-byte halves, each sample
// shuffled out of the half that holds it, the two results OR-ed together.
struct GatherPlan {
  int window = 16;            // bytes one block's samples lie within: 16 or 32
  std::vector<int64_t> base;  // per block of 8 values: where its window starts
  // Per block, 8 32-bit lanes per shuffle, each placing one sample in the low
  // byte of its lane (the other bytes 0x80: zero): lower then upper samples;
  // with a 32-byte window each is two shuffles, one per half (a sample's byte
  // in one, 0x80 in the other).
  std::vector<uint32_t> ctrl;
  std::vector<float> lerp;  // per value
};

// False when some block's samples span more than `window` bytes, or the row is
// shorter than the window: the caller tries the next window or keeps HorizontalRow.
// One pass over the values, writing each control lane once (no fill first):
// planning is per crop, and it was a tenth of the op's time.
bool PlanGather(const std::vector<Tap>& xs, int64_t row_len, int window, GatherPlan* plan) {
  const int64_t len = 3 * static_cast<int64_t>(xs.size());
  const int64_t blocks = (len + 7) / 8;
  if (row_len < window) return false;
  const int halves = window / 16;
  constexpr uint32_t kNothing = 0x80808080u;  // a lane the shuffle leaves zero
  plan->window = window;
  plan->base.resize(blocks);
  plan->ctrl.resize(2 * 8 * halves * blocks);
  plan->lerp.resize(8 * blocks);
  int64_t x = 0;  // the pixel of value k = 8 * j + e, and its channel
  int channel = 0;
  for (int64_t j = 0; j < blocks; ++j) {
    const int lanes = static_cast<int>(std::min<int64_t>(8, len - 8 * j));
    int64_t samples[2][8];
    int64_t low = row_len, high = -1;
    for (int e = 0; e < lanes; ++e) {
      const Tap& t = xs[x];
      samples[0][e] = t.lower + channel;
      samples[1][e] = t.upper + channel;
      low = std::min(low, std::min(samples[0][e], samples[1][e]));
      high = std::max(high, std::max(samples[0][e], samples[1][e]));
      plan->lerp[8 * j + e] = t.lerp;
      if (++channel == 3) {
        channel = 0;
        ++x;
      }
    }
    for (int e = lanes; e < 8; ++e) plan->lerp[8 * j + e] = 0.0f;
    // The window may not run past the row's end (the last row of the last crop
    // ends the input tensor); starting it earlier keeps every byte inside.
    const int64_t base = std::min(low, row_len - window);
    if (high - base > window - 1) return false;
    plan->base[j] = base;
    // Lane e of a 256-bit shuffle takes its byte from the copy of the 16-byte
    // half in its own 128-bit half; both halves hold the same bytes.
    uint32_t* ctrl = plan->ctrl.data() + 2 * 8 * halves * j;
    for (int which = 0; which < 2; ++which) {
      for (int h = 0; h < halves; ++h) {
        uint32_t* lane = ctrl + (which * halves + h) * 8;
        for (int e = 0; e < 8; ++e) {
          const int64_t offset = e < lanes ? samples[which][e] - base : -1;
          lane[e] = offset / 16 == h && offset >= 0
                        ? 0x80808000u | static_cast<uint32_t>(offset % 16)
                        : kNothing;
        }
      }
    }
  }
  return true;
}

// Writes 8 * blocks values: up to 7 past the row's 3 * width (padding).
// Each byte b is made a float without a conversion instruction: placed in the
// low byte of a lane holding 2^23's bit pattern it reads as 2^23 + b, exactly;
// subtracting 2^23 gives b, and the difference of two such values is the
// difference of the bytes, exactly (all below 2^24). So lo and hi - lo are the
// same floats as float(lo) and float(hi) - float(lo).
template <int kWindow>
__attribute__((target("avx2"))) void HorizontalRowGatherAvx2(const uint8_t* __restrict row,
                                                             const GatherPlan& plan,
                                                             float* __restrict out) {
  constexpr int kHalves = kWindow / 16;
  constexpr int kPerBlock = 2 * 32 * kHalves;
  const int64_t blocks = static_cast<int64_t>(plan.base.size());
  const int64_t* base = plan.base.data();
  const uint8_t* ctrl = reinterpret_cast<const uint8_t*>(plan.ctrl.data());
  const float* lerp = plan.lerp.data();
  const __m256i magic_bits = _mm256_set1_epi32(0x4B000000);  // 2^23 as a float
  const __m256 magic = _mm256_castsi256_ps(magic_bits);
  for (int64_t j = 0; j < blocks; ++j) {
    const uint8_t* c = ctrl + kPerBlock * j;
    __m256i halves[kHalves];
    for (int h = 0; h < kHalves; ++h) {
      halves[h] = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + base[j] + 16 * h)));
    }
    __m256i bits[2];
    for (int which = 0; which < 2; ++which) {
      bits[which] = magic_bits;
      for (int h = 0; h < kHalves; ++h) {
        const __m256i select =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + (which * kHalves + h) * 32));
        bits[which] = _mm256_or_si256(bits[which], _mm256_shuffle_epi8(halves[h], select));
      }
    }
    const __m256 lo_biased = _mm256_castsi256_ps(bits[0]);
    const __m256 lo = _mm256_sub_ps(lo_biased, magic);
    const __m256 diff = _mm256_sub_ps(_mm256_castsi256_ps(bits[1]), lo_biased);
    const __m256 w = _mm256_loadu_ps(lerp + 8 * j);
    _mm256_storeu_ps(out + 8 * j, _mm256_add_ps(lo, _mm256_mul_ps(diff, w)));
  }
}

__attribute__((target("avx2"))) void BlendRowsAvx2(const float* __restrict top,
                                                   const float* __restrict bottom, float lerp,
                                                   int64_t len, float* __restrict dst) {
  int64_t k = 0;
  for (; k < len && (reinterpret_cast<uintptr_t>(dst + k) & 31) != 0; ++k) {
    dst[k] = Lerp(top[k], bottom[k], lerp);
  }
  const __m256 lerp8 = _mm256_set1_ps(lerp);
  for (; k + 8 <= len; k += 8) {
    const __m256 t = _mm256_loadu_ps(top + k);
    const __m256 b = _mm256_loadu_ps(bottom + k);
    _mm256_stream_ps(dst + k, _mm256_add_ps(t, _mm256_mul_ps(_mm256_sub_ps(b, t), lerp8)));
  }
  for (; k < len; ++k) {
    dst[k] = Lerp(top[k], bottom[k], lerp);
  }
}

// The uint8 batch, as the SSE2 BlendRows above: the same float value rounded
// half to even (cvtps2dq in the default rounding mode) and saturated, 32 values
// per iteration. The two packs work within 128-bit lanes, which leaves the
// 4-value groups in the order 0 2 4 6 1 3 5 7 (of 8 groups of 4); one permute
// puts them back. Streamed stores as for float32: the uint8 batch (19 MB at
// 128 x 224 px) is no more wanted in the cache than the float32 one, and plain
// stores read every destination line first.
__attribute__((target("avx2"))) void BlendRowsAvx2(const float* __restrict top,
                                                   const float* __restrict bottom, float lerp,
                                                   int64_t len, uint8_t* __restrict dst) {
  int64_t k = 0;
  for (; k < len && (reinterpret_cast<uintptr_t>(dst + k) & 31) != 0; ++k) {
    dst[k] = RoundToByte(Lerp(top[k], bottom[k], lerp));
  }
  const __m256 lerp8 = _mm256_set1_ps(lerp);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; k + 32 <= len; k += 32) {
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      const __m256 t = _mm256_loadu_ps(top + k + 8 * j);
      const __m256 b = _mm256_loadu_ps(bottom + k + 8 * j);
      q[j] = _mm256_cvtps_epi32(_mm256_add_ps(t, _mm256_mul_ps(_mm256_sub_ps(b, t), lerp8)));
    }
    const __m256i bytes =
        _mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + k),
                        _mm256_permutevar8x32_epi32(bytes, order));
  }
  for (; k < len; ++k) {
    dst[k] = RoundToByte(Lerp(top[k], bottom[k], lerp));
  }
}
#endif

// One thread's working memory, kept from crop to crop: each crop needs buffers
// of its own sizes, and allocating them (zero-filled) per crop showed in the
// op's profile.
struct Scratch {
  std::vector<Tap> ys, xs;
  std::vector<float> rows;     // the two cached horizontally interpolated rows
  std::vector<float> widened;  // one input row as floats (HorizontalRow*)
  std::vector<float> lerp4;    // HorizontalRowAvx2's lerps, 4 per pixel
#if defined(IMAGERECORDS_AVX2)
  GatherPlan plan;
#endif
};

template <typename Out>
void ResizeOne(const uint8_t* in, int64_t in_h, int64_t in_w, bool flip, int64_t out_h,
               int64_t out_w, Out* out, Scratch* scratch) {
  if (in_h == out_h && in_w == out_w) {
    for (int64_t y = 0; y < out_h; ++y) {
      CastRow(in + y * in_w * 3, in_w, flip, out + y * out_w * 3);
    }
    return;
  }
  std::vector<Tap>& ys = scratch->ys;
  std::vector<Tap>& xs = scratch->xs;
  ComputeTaps(out_h, in_h, 1, &ys);
  ComputeTaps(out_w, in_w, 3, &xs);
  if (flip) {
    // Resize the mirrored crop: output column x samples mirrored columns
    // lower/upper, i.e. original columns in_w-1-lower / in_w-1-upper, with the
    // same lerp. Bit-identical to tf.image.resize(tf.reverse(crop, [1])), which
    // is what the stock path computes (it mirrors the uint8 crop first).
    const int64_t last = (in_w - 1) * 3;
    for (Tap& t : xs) {
      t.lower = last - t.lower;
      t.upper = last - t.upper;
    }
  }
  const int64_t row_len = out_w * 3;
  const int64_t in_stride = in_w * 3;
  // Two horizontally interpolated input rows, cached by input row index:
  // consecutive output rows mostly share their input rows.
  // Padding: HorizontalRow reads 4 floats at a tap and writes 1 float past a row;
  // HorizontalRowGatherAvx2 writes up to 7 past it (its last block of 8 values).
  std::vector<float>& buf = scratch->rows;
  buf.resize(2 * (row_len + 8));
#if defined(IMAGERECORDS_AVX2)
  const bool avx2 = HasAvx2();
  GatherPlan& plan = scratch->plan;
  const bool gather =
      avx2 && (PlanGather(xs, in_stride, 16, &plan) || PlanGather(xs, in_stride, 32, &plan));
  std::vector<float>& lerp4 = scratch->lerp4;
  if (avx2 && !gather) {
    lerp4.resize(4 * out_w + 8);
    for (int64_t x = 0; x < out_w; ++x) {
      for (int j = 0; j < 4; ++j) lerp4[4 * x + j] = xs[x].lerp;
    }
  }
#endif
  std::vector<float>& widened = scratch->widened;
  widened.resize(in_stride + 4);
  std::fill(widened.end() - 4, widened.end(), 0.0f);  // read by the last tap's 4th lane
  float* slot[2] = {buf.data(), buf.data() + row_len + 8};
  int64_t held[2] = {-1, -1};
  auto row = [&](int64_t r, int64_t keep) -> const float* {
    for (int s = 0; s < 2; ++s) {
      if (held[s] == r) return slot[s];
    }
    const int s = (held[0] == keep) ? 1 : 0;  // never evict the row still needed
#if defined(IMAGERECORDS_AVX2)
    if (gather) {
      if (plan.window == 16) {
        HorizontalRowGatherAvx2<16>(in + r * in_stride, plan, slot[s]);
      } else {
        HorizontalRowGatherAvx2<32>(in + r * in_stride, plan, slot[s]);
      }
    } else if (avx2) {
      HorizontalRowAvx2(in + r * in_stride, in_stride, xs, lerp4.data(), widened.data(), slot[s]);
    } else {
      HorizontalRow(in + r * in_stride, in_stride, xs, widened.data(), slot[s]);
    }
#else
    HorizontalRow(in + r * in_stride, in_stride, xs, widened.data(), slot[s]);
#endif
    held[s] = r;
    return slot[s];
  };
  for (int64_t y = 0; y < out_h; ++y) {
    const Tap& t = ys[y];
    const float* __restrict top = row(t.lower, t.upper);
    const float* __restrict bottom = row(t.upper, t.lower);
    const float lerp = t.lerp;
    Out* __restrict dst = out + y * row_len;
#if defined(IMAGERECORDS_AVX2)
    if (avx2) {
      BlendRowsAvx2(top, bottom, lerp, row_len, dst);
      continue;
    }
#endif
    BlendRows(top, bottom, lerp, row_len, dst);
  }
}

// Checks the shapes and flips and resizes every crop into a new batch; the
// subclass says where each crop's bytes start (after checking they are there).
template <typename Out>
class ResizeCropsBase : public OpKernel {
 public:
  explicit ResizeCropsBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::vector<int32_t> size;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("size", &size));
    OP_REQUIRES(ctx, size.size() == 2 && size[0] > 0 && size[1] > 0,
                absl::InvalidArgumentError("size must be two positive ints"));
    out_h_ = size[0];
    out_w_ = size[1];
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& shapes = ctx->input(1);
    const Tensor& flips = ctx->input(2);
    OP_REQUIRES(ctx, shapes.dims() == 2 && shapes.dim_size(1) == 2,
                absl::InvalidArgumentError("shapes must be [B, 2]"));
    const int64_t batch = shapes.dim_size(0);
    OP_REQUIRES(ctx, flips.dims() == 1 && flips.dim_size(0) == batch,
                absl::InvalidArgumentError("flips must be [B]"));
    const auto hw = shapes.matrix<int32_t>();
    const auto flip = flips.vec<bool>();
    // Each crop's size in bytes; h, w < 2^31, so h * w * 3 < 2^63.
    std::vector<int64_t> bytes(batch);
    for (int64_t i = 0; i < batch; ++i) {
      OP_REQUIRES(ctx, hw(i, 0) > 0 && hw(i, 1) > 0,
                  absl::InvalidArgumentError("every crop must be at least 1x1"));
      bytes[i] = static_cast<int64_t>(hw(i, 0)) * hw(i, 1) * 3;
    }
    std::vector<const uint8_t*> starts(batch);
    Starts(ctx, bytes, &starts);
    if (!ctx->status().ok()) return;

    Tensor* images = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, out_h_, out_w_, 3}), &images));
    Out* out = images->flat<Out>().data();
    const int64_t image_len = out_h_ * out_w_ * 3;
    auto work = [&](int64_t begin, int64_t end) {
      Scratch scratch;
      for (int64_t i = begin; i < end; ++i) {
        ResizeOne(starts[i], hw(i, 0), hw(i, 1), flip(i), out_h_, out_w_, out + i * image_len,
                  &scratch);
      }
#if defined(__SSE2__)
      _mm_sfence();  // the streamed rows are visible before this shard reports done
#endif
    };
    // Roughly 10 ns per output value; lets one batch spread over the intra-op threads.
    const auto& workers = *ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers.num_threads, workers.workers, batch, image_len * 10, work);
  }

 protected:
  // Fills starts[i] with where crop i's bytes[i] bytes are, or fails ctx.
  virtual void Starts(OpKernelContext* ctx, const std::vector<int64_t>& bytes,
                      std::vector<const uint8_t*>* starts) = 0;

 private:
  int64_t out_h_;
  int64_t out_w_;
};

template <typename Out>
class ResizeCropsOp : public ResizeCropsBase<Out> {
 public:
  using ResizeCropsBase<Out>::ResizeCropsBase;

 protected:
  void Starts(OpKernelContext* ctx, const std::vector<int64_t>& bytes,
              std::vector<const uint8_t*>* starts) override {
    const Tensor& pixels = ctx->input(0);
    OP_REQUIRES(ctx, pixels.dims() == 1 || pixels.dims() == 2,
                absl::InvalidArgumentError("pixels must be 1-D (packed) or 2-D (one row per crop)"));
    const int64_t batch = static_cast<int64_t>(bytes.size());
    const bool rows = pixels.dims() == 2;
    OP_REQUIRES(ctx, !rows || pixels.dim_size(0) == batch,
                absl::InvalidArgumentError("2-D pixels must have one row per crop"));
    // Where crop i starts; packed: right after crop i-1, rows: at i * row length.
    const int64_t available = rows ? pixels.dim_size(1) : pixels.dim_size(0);
    const uint8_t* in = pixels.flat<uint8_t>().data();
    int64_t offset = 0;
    for (int64_t i = 0; i < batch; ++i) {
      // Checking against what pixels holds before adding keeps the running sum
      // from overflowing.
      const int64_t room = rows ? available : available - offset;
      OP_REQUIRES(ctx, bytes[i] <= room,
                  absl::InvalidArgumentError("pixels does not hold sum(height * width * 3) bytes"));
      (*starts)[i] = in + (rows ? i * available : offset);
      offset += bytes[i];
    }
    OP_REQUIRES(ctx, rows || offset == available,
                absl::InvalidArgumentError("pixels does not hold sum(height * width * 3) bytes"));
  }
};

template <typename Out>
class ResizeCropListOp : public ResizeCropsBase<Out> {
 public:
  using ResizeCropsBase<Out>::ResizeCropsBase;

 protected:
  void Starts(OpKernelContext* ctx, const std::vector<int64_t>& bytes,
              std::vector<const uint8_t*>* starts) override {
    const Tensor& crops = ctx->input(0);
    OP_REQUIRES(ctx, crops.dims() == 0,
                absl::InvalidArgumentError("crops must be a scalar TensorList"));
    const TensorList* list = crops.scalar<Variant>()().get<TensorList>();
    OP_REQUIRES(ctx, list != nullptr,
                absl::InvalidArgumentError("crops must be a TensorList"));
    const int64_t batch = static_cast<int64_t>(bytes.size());
    OP_REQUIRES(ctx, static_cast<int64_t>(list->tensors().size()) == batch,
                absl::InvalidArgumentError("crops must hold one tensor per crop"));
    for (int64_t i = 0; i < batch; ++i) {
      const Tensor& crop = list->tensors()[i];
      OP_REQUIRES(ctx, crop.dtype() == ::tensorflow::DT_UINT8 && crop.NumElements() == bytes[i],
                  absl::InvalidArgumentError(
                      "crop i of crops must be uint8 with height * width * 3 values"));
      (*starts)[i] = crop.flat<uint8_t>().data();
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("ImagerecordsFlipDraws").Device(::tensorflow::DEVICE_CPU),
                        FlipDrawsOp);
REGISTER_KERNEL_BUILDER(
    Name("ImagerecordsResizeCrops").Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
    ResizeCropsOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("ImagerecordsResizeCrops").Device(::tensorflow::DEVICE_CPU).TypeConstraint<uint8_t>("T"),
    ResizeCropsOp<uint8_t>);
REGISTER_KERNEL_BUILDER(
    Name("ImagerecordsResizeCropList").Device(::tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
    ResizeCropListOp<float>);
REGISTER_KERNEL_BUILDER(Name("ImagerecordsResizeCropList")
                            .Device(::tensorflow::DEVICE_CPU)
                            .TypeConstraint<uint8_t>("T"),
                        ResizeCropListOp<uint8_t>);

}  // namespace imagerecords
