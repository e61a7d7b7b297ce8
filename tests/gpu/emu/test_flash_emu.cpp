/* The tensor-core attention kernels (devices/cuda/attention_tc.cuh) run for the host on the
 * stand-in of cuda_emu.h, against a float64 reference, on every machine: forward (f32 and bf16
 * outputs) and gradient, causal and not, grouped queries, head dimensions 16 to 128, sequences
 * that end inside a tile and shorter than one, operands aligned for 16-byte loads and not. Each
 * result is held to 2^-6 (outputs) or 2^-5 (d(qkv)) of the sum of its terms' magnitudes, what the
 * kernels' bf16 roundings of P, dS and dO allow with a factor 4 to spare; a wrong mask, tile, index
 * or missing barrier moves results by the order of the magnitudes. Guard values around every buffer
 * must stay as they were, and a second run of the first shape must repeat the bits. Exit status 0
 * when every case passes. */
#define MW_TC_EMULATE 1
#include "devices/cuda/attention_tc.cuh"

#include <cstdio>
#include <vector>

thread_local dim3 threadIdx, blockIdx;
thread_local emu_block *emu_here;

namespace {

struct shape {
    int slices, t, group, d, causal;
    int shift; /* qkv and gy one element past 16-byte alignment: the one-at-a-time loads */
    const char *name;
};

const int64_t GUARD = 64; /* elements before and after every buffer */
const float SENTINEL = -12345.5f;

/* Layouts: qkv and d(qkv) [slice][t][group + 2][d], out and gy [slice][t][group][d]. */
struct problem {
    shape sh;
    std::vector<uint16_t> qkv;
    std::vector<float> gy;
    int64_t nqkv, nout;
    float scale;
};

uint64_t rng = 0x9e3779b97f4a7c15ull;
float uniform() { /* in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

mw__k_attention descriptor(const problem &p) {
    const shape &s = p.sh;
    mw__k_attention k;
    std::memset(&k, 0, sizeof k);
    k.causal = s.causal;
    k.qkv_dtype = MW_BF16;
    k.out_dtype = MW_F32;
    k.scale = p.scale;
    k.t = s.t;
    k.d = s.d;
    k.seq_qkv = (int64_t)(s.group + 2) * s.d;
    k.seq_out = (int64_t)s.group * s.d;
    k.part = s.d;
    k.group = s.group;
    k.out_group = s.d;
    k.walk.rank = 1;
    k.walk.dims[0] = s.slices;
    k.walk.stride[0][0] = (int64_t)s.t * k.seq_out;
    k.walk.stride[1][0] = (int64_t)s.t * k.seq_qkv;
    k.slices = s.slices;
    k.block = 64;
    return k;
}

int64_t qat(const shape &s, int64_t sl, int64_t i, int64_t part, int64_t e) {
    return ((sl * s.t + i) * (s.group + 2) + part) * s.d + e;
}
int64_t oat(const shape &s, int64_t sl, int64_t i, int64_t g, int64_t e) {
    return ((sl * s.t + i) * s.group + g) * s.d + e;
}

/* The reference in double, and each result's sum of term magnitudes. */
struct reference {
    std::vector<double> y, ymag, dqkv, dmag;
};

reference reference_of(const problem &p) {
    const shape &s = p.sh;
    reference r{std::vector<double>(p.nout), std::vector<double>(p.nout),
                std::vector<double>(p.nqkv), std::vector<double>(p.nqkv)};
    auto val = [&](int64_t sl, int64_t i, int64_t part, int64_t e) {
        return (double)mw__bf16_to_f32(p.qkv[qat(s, sl, i, part, e)]);
    };
    std::vector<double> pr(s.t), dp(s.t);
    for (int64_t sl = 0; sl < s.slices; sl++)
        for (int64_t g = 0; g < s.group; g++)
            for (int64_t i = 0; i < s.t; i++) {
                int64_t n = s.causal ? i + 1 : s.t;
                double mx = -INFINITY, sum = 0.0, dsum = 0.0;
                for (int64_t j = 0; j < n; j++) {
                    double d = 0.0;
                    for (int64_t e = 0; e < s.d; e++)
                        d += val(sl, i, g, e) * val(sl, j, s.group, e);
                    pr[j] = p.scale * d;
                    mx = std::fmax(mx, pr[j]);
                }
                for (int64_t j = 0; j < n; j++) sum += (pr[j] = std::exp(pr[j] - mx));
                for (int64_t j = 0; j < n; j++) {
                    pr[j] /= sum;
                    double d = 0.0;
                    for (int64_t e = 0; e < s.d; e++)
                        d += (double)p.gy[oat(s, sl, i, g, e)] * val(sl, j, s.group + 1, e);
                    dp[j] = d;
                    dsum += pr[j] * d;
                }
                for (int64_t j = 0; j < n; j++) {
                    double ds = pr[j] * (dp[j] - dsum);
                    for (int64_t e = 0; e < s.d; e++) {
                        int64_t o = oat(s, sl, i, g, e);
                        double v = val(sl, j, s.group + 1, e), gyv = p.gy[o];
                        r.y[o] += pr[j] * v;
                        r.ymag[o] += pr[j] * std::fabs(v);
                        int64_t q = qat(s, sl, i, g, e), kk = qat(s, sl, j, s.group, e),
                                vv = qat(s, sl, j, s.group + 1, e);
                        r.dqkv[q] += p.scale * ds * val(sl, j, s.group, e);
                        r.dmag[q] += p.scale * std::fabs(ds * val(sl, j, s.group, e));
                        r.dqkv[kk] += p.scale * ds * val(sl, i, g, e);
                        r.dmag[kk] += p.scale * std::fabs(ds * val(sl, i, g, e));
                        r.dqkv[vv] += pr[j] * gyv;
                        r.dmag[vv] += pr[j] * std::fabs(gyv);
                    }
                }
            }
    return r;
}

/* A buffer of n elements with GUARD sentinels each side. */
template <typename T> struct guarded {
    std::vector<T> v;
    T sentinel;
    explicit guarded(int64_t n, T s) : v((size_t)(n + 2 * GUARD), s), sentinel(s) {}
    T *data() { return v.data() + GUARD; }
    bool intact() const {
        for (int64_t i = 0; i < GUARD; i++)
            if (std::memcmp(&v[(size_t)i], &sentinel, sizeof(T)) ||
                std::memcmp(&v[v.size() - 1 - (size_t)i], &sentinel, sizeof(T)))
                return false;
        return true;
    }
};

int failures = 0;

void fail(const char *what, const shape &s, int64_t at, double got, double want, double tol) {
    if (failures++ < 20)
        std::printf("FAIL %s: %s at %lld: %.9g, reference %.9g (tolerance %.3g)\n", s.name, what,
                    (long long)at, got, want, tol);
}

void forward(const problem &p, int bf16_out, std::vector<float> &y) {
    mw__k_attention k = descriptor(p);
    k.out_dtype = bf16_out ? MW_BF16 : MW_F32;
    guarded<uint16_t> qkv(p.nqkv + 1, 0x7fc1); /* NaN bits: read past the end, they would show */
    std::memcpy(qkv.data() + p.sh.shift, p.qkv.data(), p.qkv.size() * sizeof(uint16_t));
    k.qkv = qkv.data() + p.sh.shift;
    unsigned blocks = (unsigned)((p.sh.t + TC_ROWS - 1) / TC_ROWS);
    dim3 grid(blocks, (unsigned)(p.sh.slices * p.sh.group));
    size_t smem = smem_forward(p.sh.d);
    y.assign((size_t)p.nout, 0.0f);
    if (bf16_out) {
        guarded<uint16_t> out(p.nout, 0x1234);
        k.out = out.data();
        emu_launch(grid, TC_THREADS, smem, [&] { k_flash_forward<uint16_t>(k); });
        if (!out.intact()) fail("forward (bf16) wrote outside its output", p.sh, -1, 0, 0, 0);
        for (int64_t i = 0; i < p.nout; i++) y[(size_t)i] = mw__bf16_to_f32(out.data()[i]);
    } else {
        guarded<float> out(p.nout, SENTINEL);
        k.out = out.data();
        emu_launch(grid, TC_THREADS, smem, [&] { k_flash_forward<float>(k); });
        if (!out.intact()) fail("forward wrote outside its output", p.sh, -1, 0, 0, 0);
        std::memcpy(y.data(), out.data(), (size_t)p.nout * sizeof(float));
    }
    if (!qkv.intact()) fail("forward wrote into qkv's guards", p.sh, -1, 0, 0, 0);
}

void backward(const problem &p, std::vector<float> &d) {
    mw__k_attention k = descriptor(p);
    guarded<uint16_t> qkv(p.nqkv + 1, 0x7fc1);
    std::memcpy(qkv.data() + p.sh.shift, p.qkv.data(), p.qkv.size() * sizeof(uint16_t));
    guarded<float> gy(p.nout + 1, NAN), out(p.nqkv, SENTINEL);
    std::memcpy(gy.data() + p.sh.shift, p.gy.data(), p.gy.size() * sizeof(float));
    int64_t rows = (int64_t)p.sh.slices * p.sh.group * p.sh.t;
    guarded<float> stats(2 * rows, SENTINEL); /* lse, then D */
    k.qkv = qkv.data() + p.sh.shift;
    k.gy = gy.data() + p.sh.shift;
    k.out = out.data();
    unsigned blocks = (unsigned)((p.sh.t + TC_ROWS - 1) / TC_ROWS);
    float *lse = stats.data(), *dsum = lse + rows;
    emu_launch(dim3(blocks, (unsigned)(p.sh.slices * p.sh.group)), TC_THREADS, smem_dq(p.sh.d),
               [&] { k_flash_dq(k, lse, dsum); });
    emu_launch(dim3(blocks, (unsigned)p.sh.slices), TC_THREADS, smem_dkv(p.sh.d),
               [&] { k_flash_dkv(k, lse, dsum); });
    if (!out.intact() || !stats.intact() || !qkv.intact() || !gy.intact())
        fail("backward wrote outside its buffers", p.sh, -1, 0, 0, 0);
    d.assign(out.data(), out.data() + p.nqkv);
}

void check(const shape &s, int repeat) {
    problem p{s, {}, {}, 0, 0, 0.0f};
    p.nqkv = (int64_t)s.slices * s.t * (s.group + 2) * s.d;
    p.nout = (int64_t)s.slices * s.t * s.group * s.d;
    p.scale = 1.0f / std::sqrt((float)s.d) * 2.0f; /* sharper than usual: masks matter more */
    p.qkv.resize((size_t)p.nqkv);
    p.gy.resize((size_t)p.nout);
    for (auto &h : p.qkv) h = mw__bf16_from_f32(uniform());
    for (auto &g : p.gy) g = uniform();
    reference r = reference_of(p);
    std::vector<float> y, y16, d, y2, d2;
    forward(p, 0, y);
    forward(p, 1, y16);
    backward(p, d);
    for (int64_t i = 0; i < p.nout; i++) {
        double tol = std::ldexp(r.ymag[(size_t)i], -6) + 1e-6;
        if (!(std::fabs(y[(size_t)i] - r.y[(size_t)i]) <= tol))
            fail("y", s, i, y[(size_t)i], r.y[(size_t)i], tol);
        tol += std::ldexp(std::fabs(r.y[(size_t)i]), -7); /* the output's own bf16 rounding */
        if (!(std::fabs(y16[(size_t)i] - r.y[(size_t)i]) <= tol))
            fail("y (bf16)", s, i, y16[(size_t)i], r.y[(size_t)i], tol);
    }
    for (int64_t i = 0; i < p.nqkv; i++) {
        double tol = std::ldexp(r.dmag[(size_t)i], -5) + 1e-6;
        if (!(std::fabs(d[(size_t)i] - r.dqkv[(size_t)i]) <= tol))
            fail("d(qkv)", s, i, d[(size_t)i], r.dqkv[(size_t)i], tol);
    }
    if (!repeat) {
        std::printf("%s %s\n", failures ? "after" : "ok  ", s.name);
        return;
    }
    forward(p, 0, y2);
    backward(p, d2);
    if (std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)) ||
        std::memcmp(d.data(), d2.data(), d.size() * sizeof(float)))
        fail("a second run did not repeat the bits", s, -1, 0, 0, 0);
    std::printf("%s %s\n", failures ? "after" : "ok  ", s.name);
}

} // namespace

int main() {
    const shape shapes[] = {
        {2, 130, 2, 32, 1, 0, "causal, 2 slices, groups of 2, T 130, D 32"},
        {1, 64, 1, 64, 0, 0, "full, T 64 (one tile), D 64"},
        {1, 100, 1, 128, 1, 0, "causal, T 100, D 128"},
        {3, 17, 3, 16, 1, 0, "causal, 3 slices, groups of 3, T 17 (inside a tile), D 16"},
        {1, 129, 1, 48, 0, 0, "full, T 129 (one row into a third tile), D 48"},
        {2, 70, 2, 32, 1, 1, "causal, groups of 2, T 70, D 32, operands not 16-byte aligned"},
    };
    for (const shape &s : shapes) check(s, &s == shapes); /* the bits repeat: the first */
    if (failures) std::printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
