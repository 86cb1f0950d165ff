// The host's softmax, built for the machine like the attention node (see csrc/CMakeLists.txt): a
// sampled verify row at a 152k vocabulary is one of these per drafted token, and with expf one
// value at a time they took about 5 % of a 0.6B model's speculative step.
#include "dspark-sampler.h"
#include "dspark-simd.h"

#include <algorithm>
#include <cmath>

namespace {

float max_scaled(const float * v, size_t n, float scale) {
    size_t i = 0;
    float mx = -INFINITY;
#if DSPARK_SIMD_AVX2
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        m8 = _mm256_max_ps(m8, _mm256_mul_ps(_mm256_loadu_ps(v + i), vs));
    }
    mx = dspark_hmax8(m8);
#endif
    for (; i < n; ++i) {
        mx = std::max(mx, v[i] * scale);
    }
    return mx;
}

// v[i] = exp(v[i] · scale - mx) in place; returns their sum (in double: partial sums of at most
// 1024 values in float, added in double).
double exp_shifted(float * v, size_t n, float scale, float mx) {
    size_t i = 0;
    double sum = 0.0;
#if DSPARK_SIMD_AVX2
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(mx), lowest = _mm256_set1_ps(-87.0f);
    const size_t whole = n - n % 8;
    while (i < whole) {
        const size_t end = std::min(whole, i + 1024);
        __m256 acc = _mm256_setzero_ps();
        for (; i < end; i += 8) {
            const __m256 z = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), vs), vm);
            // exact zeros where the logit is -inf (ids a reduced-vocabulary draft cannot produce)
            const __m256 e = _mm256_and_ps(dspark_exp8(z), _mm256_cmp_ps(z, lowest, _CMP_GE_OQ));
            _mm256_storeu_ps(v + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        sum += dspark_hsum8(acc);
    }
#endif
    for (; i < n; ++i) {
        v[i] = expf(v[i] * scale - mx);
        sum += v[i];
    }
    return sum;
}

}  // namespace

void dspark_softmax(std::vector<float> & x, float scale) {
    const float mx = max_scaled(x.data(), x.size(), scale);
    const float inv = (float) (1.0 / exp_shifted(x.data(), x.size(), scale, mx));
    for (float & v : x) {
        v *= inv;
    }
}
