#include "kernels/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace specserve::kernels::reference {
namespace {

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double Silu(double x) { return x * Sigmoid(x); }
double Softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

double HalfToDouble(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

}  // namespace

double WeightAt(DType dtype, const void* w, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(w)[i];
    case DType::kBF16: {
      const uint32_t bits =
          static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case DType::kF16:
      return HalfToDouble(static_cast<const uint16_t*>(w)[i]);
  }
  return 0;
}

std::vector<double> Matmul(int64_t rows, int64_t in, int64_t out,
                           const float* x, DType dtype, const void* w,
                           const std::vector<float>& init) {
  std::vector<double> y(rows * out);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double s = init.empty() ? 0.0 : init[t * out + o];
      for (int64_t i = 0; i < in; ++i)
        s += double(x[t * in + i]) * WeightAt(dtype, w, o * in + i);
      y[t * out + o] = s;
    }
  }
  return y;
}

std::vector<double> RmsNorm(int64_t rows, int64_t dim, const float* x,
                            const float* w, bool plus_one, double eps) {
  std::vector<double> y(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      y[r * dim + i] =
          x[r * dim + i] * inv * (plus_one ? 1.0 + w[i] : double(w[i]));
    }
  }
  return y;
}

std::vector<double> GatedRmsNorm(int64_t rows, int64_t dim, const float* x,
                                 const float* z, const float* w, double eps) {
  std::vector<double> y(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i)
      ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) {
      y[r * dim + i] = w[i] * (x[r * dim + i] * inv) * Silu(z[r * dim + i]);
    }
  }
  return y;
}

std::vector<double> Rope(int64_t rows, int64_t heads, int64_t head_dim,
                         int64_t rotary_dim, const float* x,
                         int64_t first_position, double theta) {
  std::vector<double> y(x, x + rows * heads * head_dim);
  const int64_t half = rotary_dim / 2;
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* xi = x + (t * heads + h) * head_dim;
      double* yi = y.data() + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double inv_freq = std::pow(theta, -2.0 * i / rotary_dim);
        const double angle = double(first_position + t) * inv_freq;
        yi[i] = xi[i] * std::cos(angle) - xi[i + half] * std::sin(angle);
        yi[i + half] = xi[i + half] * std::cos(angle) + xi[i] * std::sin(angle);
      }
    }
  }
  return y;
}

std::vector<double> Attention(int64_t rows, int64_t nh, int64_t nkv, int64_t hd,
                              const float* q, const float* gate,
                              const float* k_cache, const float* v_cache,
                              int64_t first_position, double scale) {
  std::vector<double> out(rows * nh * hd);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t n = first_position + t + 1;
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / (nh / nkv);
      const float* qi = q + (t * nh + h) * hd;
      std::vector<double> s(n);
      double m = -INFINITY;
      for (int64_t r = 0; r < n; ++r) {
        double d = 0;
        for (int64_t i = 0; i < hd; ++i)
          d += double(qi[i]) * k_cache[r * nkv * hd + kvh * hd + i];
        s[r] = d * scale;
        m = std::max(m, s[r]);
      }
      double sum = 0;
      for (auto& v : s) sum += (v = std::exp(v - m));
      for (int64_t i = 0; i < hd; ++i) {
        double a = 0;
        for (int64_t r = 0; r < n; ++r)
          a += s[r] / sum * v_cache[r * nkv * hd + kvh * hd + i];
        if (gate) a *= Sigmoid(gate[(t * nh + h) * hd + i]);
        out[t * nh * hd + h * hd + i] = a;
      }
    }
  }
  return out;
}

void Conv1d(int64_t rows, int64_t channels, int64_t kernel, const float* x,
            const float* weight, const float* state_in, bool silu,
            std::vector<double>* y, std::vector<double>* states) {
  const int64_t s = kernel - 1;
  std::vector<double> st(state_in, state_in + channels * s);
  y->assign(rows * channels, 0);
  states->assign(rows * channels * s, 0);
  for (int64_t t = 0; t < rows; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      std::vector<double> win(st.begin() + c * s, st.begin() + (c + 1) * s);
      win.push_back(x[t * channels + c]);
      double acc = 0;
      for (int64_t j = 0; j < kernel; ++j)
        acc += weight[c * kernel + j] * win[j];
      (*y)[t * channels + c] = silu ? Silu(acc) : acc;
      for (int64_t j = 0; j < s; ++j) st[c * s + j] = win[j + 1];
    }
    std::copy(st.begin(), st.end(), states->begin() + t * channels * s);
  }
}

void GatedDeltaRule(int64_t rows, int64_t nk, int64_t nv, int64_t dk,
                    int64_t dv, const float* qkv, const float* a,
                    const float* b, const float* a_log, const float* dt_bias,
                    const float* state_in, std::vector<double>* out,
                    std::vector<double>* states) {
  const int64_t width = 2 * nk * dk + nv * dv;
  const int64_t ssize = nv * dk * dv;
  std::vector<double> S(state_in, state_in + ssize);
  out->assign(rows * nv * dv, 0);
  states->assign(rows * ssize, 0);
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = qkv + t * width;
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t kh = h / (nv / nk);
      std::vector<double> q(dk), k(dk);
      double qs = 0, ks = 0;
      for (int64_t i = 0; i < dk; ++i) {
        q[i] = row[kh * dk + i];
        k[i] = row[nk * dk + kh * dk + i];
        qs += q[i] * q[i];
        ks += k[i] * k[i];
      }
      for (int64_t i = 0; i < dk; ++i) {
        q[i] = q[i] / std::sqrt(qs + 1e-6) / std::sqrt(double(dk));
        k[i] = k[i] / std::sqrt(ks + 1e-6);
      }
      const double beta = Sigmoid(b[t * nv + h]);
      const double g = -std::exp(double(a_log[h])) *
                       Softplus(double(a[t * nv + h]) + dt_bias[h]);
      double* Sh = S.data() + h * dk * dv;
      for (int64_t i = 0; i < dk * dv; ++i) Sh[i] *= std::exp(g);
      for (int64_t j = 0; j < dv; ++j) {
        double u = 0;
        for (int64_t i = 0; i < dk; ++i) u += Sh[i * dv + j] * k[i];
        const double delta = beta * (row[2 * nk * dk + h * dv + j] - u);
        for (int64_t i = 0; i < dk; ++i) Sh[i * dv + j] += k[i] * delta;
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += Sh[i * dv + j] * q[i];
        (*out)[t * nv * dv + h * dv + j] = o;
      }
    }
    std::copy(S.begin(), S.end(), states->begin() + t * ssize);
  }
}

std::vector<double> Swiglu(int64_t n, const float* gate, const float* up) {
  std::vector<double> y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = Silu(gate[i]) * up[i];
  return y;
}

std::vector<double> LogSumExp(int64_t rows, int64_t cols, const float* x,
                              double inv_temperature) {
  std::vector<double> y(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int64_t i = 0; i < cols; ++i)
      m = std::max(m, x[r * cols + i] * inv_temperature);
    double s = 0;
    for (int64_t i = 0; i < cols; ++i)
      s += std::exp(x[r * cols + i] * inv_temperature - m);
    y[r] = m + std::log(s);
  }
  return y;
}

std::vector<double> Softmax(int64_t rows, int64_t cols, const float* x,
                            double inv_temperature) {
  std::vector<double> y(rows * cols);
  const std::vector<double> lse = LogSumExp(rows, cols, x, inv_temperature);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      y[r * cols + i] = std::exp(x[r * cols + i] * inv_temperature - lse[r]);
    }
  }
  return y;
}

}  // namespace specserve::kernels::reference
