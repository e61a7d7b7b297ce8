/* Pipeline-parallel schedules (parallel/pipeline_schedule.h) against their closed forms: every
 * (stage, micro-batch) worked once, hand-written orders of Megatron's 1F1B and interleaved
 * schedules and of ZB-H1, the idle fractions with equal stage times (GPipe and 1F1B
 * (P-1)/(M+P-1), interleaved (P-1)/(V*M+P-1), ZB-H1 (P-1)/(3M+P-1)), makespans of chains and of
 * GPipe with transfers, activations in flight, and the errors: bad arguments, corrupted
 * schedules, deadlocks, allocation failures. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "meshwit.h"
#include "meshwit/testing.h"
#include "parallel/pipeline_schedule.h"

/* Times are sums of small integers (and of halves) here, exact in double; 1e-9 only absorbs the
 * division of an idle fraction. */
#define TOL 1e-9
#define MAX_STAGES 64

static const double ones[MAX_STAGES] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

static mw__pipe_schedule make(mw__pipe_sched kind, int P, int M, int V) {
    mw__pipe_schedule s;
    cr_assert_eq(mw__pipe_schedule_make(kind, P, M, V, &s), MW_OK, "kind %d P %d M %d V %d: %s",
                 (int)kind, P, M, V, mw_last_error());
    return s;
}

static double simulate(const mw__pipe_schedule *s, const double *tf, const double *tb,
                       const double *tw, double comm, double *idle) {
    double total = -1;
    cr_assert_eq(mw__pipe_schedule_simulate(s, tf, tb, tw, comm, &total, idle), MW_OK,
                 "kind %d P %d M %d V %d: %s", s->kind, s->devices, s->micro, s->chunks,
                 mw_last_error());
    return total;
}

static void expect_error(mw_status got, mw_status want, const char *fragment) {
    cr_assert_eq(got, want, "status %d, want %d (%s)", got, want, mw_last_error());
    cr_assert(strstr(mw_last_error(), fragment), "message \"%s\" lacks \"%s\"", mw_last_error(),
              fragment);
}

/* --- every unit of work once ------------------------------------------------------------------ */

typedef struct shape {
    int P, M, V;
} shape;

static const shape plain[] = {{1, 1, 1}, {1, 5, 1}, {2, 1, 1}, {2, 2, 1}, {2, 7, 1}, {3, 2, 1},
                              {3, 9, 1}, {4, 3, 1}, {4, 4, 1}, {4, 8, 1}, {8, 3, 1}, {8, 16, 1}};
static const shape virt[] = {{1, 1, 2}, {1, 3, 4}, {2, 2, 2}, {2, 6, 3},  {3, 3, 2},
                             {4, 4, 2}, {4, 8, 2}, {4, 8, 4}, {4, 16, 3}, {8, 16, 2}};

static void check_coverage(mw__pipe_sched kind, shape sh) {
    mw__pipe_schedule s = make(kind, sh.P, sh.M, sh.V);
    static int seen[3][MAX_STAGES][64];
    memset(seen, 0, sizeof seen);
    int split = kind == MW__PIPE_ZERO_BUBBLE;
    for (int d = 0; d < sh.P; d++) {
        cr_assert_eq(s.nact[d], (split ? 3 : 2) * sh.M * sh.V, "device %d: %d actions", d,
                     s.nact[d]);
        for (int i = 0; i < s.nact[d]; i++) {
            mw__pipe_action a = s.act[d][i];
            cr_assert(a.kind >= MW__PIPE_F && a.kind <= (split ? MW__PIPE_W : MW__PIPE_B));
            cr_assert(a.micro >= 0 && a.micro < sh.M && a.chunk >= 0 && a.chunk < sh.V);
            seen[a.kind][a.chunk * sh.P + d][a.micro]++;
        }
    }
    for (int k = 0; k < (split ? 3 : 2); k++)
        for (int st = 0; st < sh.P * sh.V; st++)
            for (int m = 0; m < sh.M; m++)
                cr_assert_eq(seen[k][st][m], 1,
                             "kind %d P %d M %d V %d: action %d of stage %d, "
                             "micro-batch %d runs %d times",
                             (int)kind, sh.P, sh.M, sh.V, k, st, m, seen[k][st][m]);
    simulate(&s, ones, ones, split ? ones : NULL, 0.25, NULL);
    mw__pipe_schedule_free(&s);
}

Test(pipeline_schedule, every_stage_and_micro_batch_once) {
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        check_coverage(MW__PIPE_GPIPE, plain[i]);
        check_coverage(MW__PIPE_1F1B, plain[i]);
        check_coverage(MW__PIPE_ZERO_BUBBLE, plain[i]);
    }
    for (size_t i = 0; i < sizeof virt / sizeof *virt; i++)
        check_coverage(MW__PIPE_INTERLEAVED, virt[i]);
}

/* --- orders written out by hand ----------------------------------------------------------------
 */

#define F(m, c)                                                                                    \
    { MW__PIPE_F, m, c }
#define B(m, c)                                                                                    \
    { MW__PIPE_B, m, c }
#define W(m)                                                                                       \
    { MW__PIPE_W, m, 0 }

static void check_order(const mw__pipe_schedule *s, int d, const mw__pipe_action *want, int n) {
    cr_assert_eq(s->nact[d], n, "device %d: %d actions, want %d", d, s->nact[d], n);
    for (int i = 0; i < n; i++)
        cr_assert(s->act[d][i].kind == want[i].kind && s->act[d][i].micro == want[i].micro &&
                      s->act[d][i].chunk == want[i].chunk,
                  "device %d action %d: kind %d micro %d chunk %d, want kind %d micro %d chunk %d",
                  d, i, s->act[d][i].kind, s->act[d][i].micro, s->act[d][i].chunk, want[i].kind,
                  want[i].micro, want[i].chunk);
}

Test(pipeline_schedule, orders) {
    /* GPipe: all forwards, then the backwards in rising order (torch's ScheduleGPipe). */
    mw__pipe_schedule s = make(MW__PIPE_GPIPE, 3, 3, 1);
    const mw__pipe_action gpipe[] = {F(0, 0), F(1, 0), F(2, 0), B(0, 0), B(1, 0), B(2, 0)};
    for (int d = 0; d < 3; d++) check_order(&s, d, gpipe, 6);
    mw__pipe_schedule_free(&s);

    /* 1F1B, P = 4, M = 6, device 1: P-1-d = 2 warm-up forwards, four F-B pairs, two B. */
    s = make(MW__PIPE_1F1B, 4, 6, 1);
    const mw__pipe_action f1b[] = {F(0, 0), F(1, 0), F(2, 0), B(0, 0), F(3, 0), B(1, 0),
                                   F(4, 0), B(2, 0), F(5, 0), B(3, 0), B(4, 0), B(5, 0)};
    check_order(&s, 1, f1b, 12);
    mw__pipe_schedule_free(&s);

    /* Megatron's interleaving, P = 2, V = 2, M = 4: device 0 warms up with
     * (P-0-1)*2 + (V-1)*P = 4 forwards, device 1 with 2; forwards take micro-batches in groups of
     * P through chunk 0 then chunk 1, backwards the same groups through chunk 1 then chunk 0. */
    s = make(MW__PIPE_INTERLEAVED, 2, 4, 2);
    const mw__pipe_action v0[] = {F(0, 0), F(1, 0), F(0, 1), F(1, 1), F(2, 0), B(0, 1),
                                  F(3, 0), B(1, 1), F(2, 1), B(0, 0), F(3, 1), B(1, 0),
                                  B(2, 1), B(3, 1), B(2, 0), B(3, 0)};
    const mw__pipe_action v1[] = {F(0, 0), F(1, 0), F(0, 1), B(0, 1), F(1, 1), B(1, 1),
                                  F(2, 0), B(0, 0), F(3, 0), B(1, 0), F(2, 1), B(2, 1),
                                  F(3, 1), B(3, 1), B(2, 0), B(3, 0)};
    check_order(&s, 0, v0, 16);
    check_order(&s, 1, v1, 16);
    mw__pipe_schedule_free(&s);

    /* ZB-H1, P = 4, M = 6, device 2: P-d = 2 forwards, d = 2 pairs B, F whose W wait, then
     * B, F, W, then B, W, then the two held-back W. */
    s = make(MW__PIPE_ZERO_BUBBLE, 4, 6, 1);
    const mw__pipe_action zb[] = {F(0, 0), F(1, 0), B(0, 0), F(2, 0), B(1, 0), F(3, 0),
                                  B(2, 0), F(4, 0), W(0),    B(3, 0), F(5, 0), W(1),
                                  B(4, 0), W(2),    B(5, 0), W(3),    W(4),    W(5)};
    check_order(&s, 2, zb, 18);
    mw__pipe_schedule_free(&s);
}

/* --- idle time ----------------------------------------------------------------------------------
 * With F = B = 1 per stage and no transfer time, GPipe and 1F1B both take 2(M+P-1): micro-batch
 * M-1 leaves the last device's forward at M+P-1, and the backward needs as long again. Every
 * device is busy 2M of it, so idle = 2(P-1) / 2(M+P-1) = (P-1)/(M+P-1) on every device. */

Test(pipeline_schedule, gpipe_and_1f1b_bubble) {
    const int Ps[] = {1, 2, 3, 4, 8}, Ms[] = {1, 2, 3, 4, 5, 8, 16};
    const mw__pipe_sched kinds[] = {MW__PIPE_GPIPE, MW__PIPE_1F1B};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 7; j++) {
                int P = Ps[i], M = Ms[j];
                mw__pipe_schedule s = make(kinds[k], P, M, 1);
                double idle[MW_MAX_DEVICES], want = (double)(P - 1) / (M + P - 1);
                double total = simulate(&s, ones, ones, NULL, 0.0, idle);
                cr_assert_float_eq(total, 2.0 * (M + P - 1), TOL, "kind %d P %d M %d: %g",
                                   (int)kinds[k], P, M, total);
                for (int d = 0; d < P; d++)
                    cr_assert_float_eq(idle[d], want, TOL, "kind %d P %d M %d device %d: %g",
                                       (int)kinds[k], P, M, d, idle[d]);
                mw__pipe_schedule_free(&s);
            }
}

/* Megatron's interleaving with V chunks of F = B = 1 per chunk (per model stage): each device is
 * busy 2VM, and the bubble is 2(P-1), V times shorter than the non-interleaved bubble of stages
 * V times longer (Narayanan et al. 2021, bubble fraction (P-1)/(VM) of the ideal time), so the
 * makespan is 2(VM+P-1) and idle = (P-1)/(VM+P-1) on every device, for M a multiple of P. */
Test(pipeline_schedule, interleaved_bubble) {
    for (int P = 1; P <= 4; P++)
        for (int V = 2; V <= 4; V++)
            for (int g = 1; g <= 3; g++) {
                int M = g * P;
                mw__pipe_schedule s = make(MW__PIPE_INTERLEAVED, P, M, V);
                double idle[MW_MAX_DEVICES], want = (double)(P - 1) / (V * M + P - 1);
                double total = simulate(&s, ones, ones, NULL, 0.0, idle);
                cr_assert_float_eq(total, 2.0 * (V * M + P - 1), TOL, "P %d M %d V %d: %g", P, M, V,
                                   total);
                for (int d = 0; d < P; d++)
                    cr_assert_float_eq(idle[d], want, TOL, "P %d M %d V %d device %d: %g", P, M, V,
                                       d, idle[d]);
                mw__pipe_schedule_free(&s);
            }
}

/* ZB-H1 with F = B = W = 1: the backward chain moves one unit per device, so (for M >= P) the
 * only bubble is each device's wait of P-1 before its first B (Qi et al.: (P-1)(F+B-W)), the
 * makespan 3M+P-1 and idle (P-1)/(3M+P-1), against 1F1B's (P-1)/(M+P-1) with B+W = 2. At
 * P = 4, M = 8 that is 3/27 against 3/11, below the half the schedule is here for. */
Test(pipeline_schedule, zero_bubble_bubble) {
    for (int P = 1; P <= 8; P++)
        for (int M = P; M <= 3 * P; M += P > 1 ? P - 1 : 1) {
            mw__pipe_schedule s = make(MW__PIPE_ZERO_BUBBLE, P, M, 1);
            double idle[MW_MAX_DEVICES], want = (double)(P - 1) / (3 * M + P - 1);
            double total = simulate(&s, ones, ones, ones, 0.0, idle);
            cr_assert_float_eq(total, 3.0 * M + P - 1, TOL, "P %d M %d: %g", P, M, total);
            for (int d = 0; d < P; d++)
                cr_assert_float_eq(idle[d], want, TOL, "P %d M %d device %d: %g", P, M, d, idle[d]);
            mw__pipe_schedule_free(&s);
        }

    mw__pipe_schedule zb = make(MW__PIPE_ZERO_BUBBLE, 4, 8, 1), f1b = make(MW__PIPE_1F1B, 4, 8, 1);
    double izb[MW_MAX_DEVICES], i1f1b[MW_MAX_DEVICES];
    simulate(&zb, ones, ones, ones, 0.0, izb);
    simulate(&f1b, ones, ones, ones, 0.0, i1f1b); /* 1F1B's B is B + W: 2 */
    for (int d = 0; d < 4; d++) {
        cr_assert_float_eq(i1f1b[d], 3.0 / 11.0, TOL, "1F1B device %d: %g", d, i1f1b[d]);
        cr_assert_leq(izb[d], 0.5 * i1f1b[d], "device %d: ZB-H1 idle %g, 1F1B %g", d, izb[d],
                      i1f1b[d]);
    }
    mw__pipe_schedule_free(&zb);
    mw__pipe_schedule_free(&f1b);
}

/* GPipe with a transfer time c: the forward chain of the last micro-batch and the backward chain
 * of the last one each cross P-1 boundaries, and nothing else waits on a transfer, so the
 * makespan is 2(M+P-1) + 2(P-1)c. */
Test(pipeline_schedule, gpipe_transfers) {
    for (int P = 1; P <= 5; P++)
        for (int M = 1; M <= 9; M += 2) {
            mw__pipe_schedule s = make(MW__PIPE_GPIPE, P, M, 1);
            double total = simulate(&s, ones, ones, NULL, 0.5, NULL);
            cr_assert_float_eq(total, 2.0 * (M + P - 1) + (P - 1), TOL, "P %d M %d: %g", P, M,
                               total);
            mw__pipe_schedule_free(&s);
        }
}

/* One micro-batch is a chain: its makespan is the sum of its stage times and crossings, whatever
 * the schedule, except that ZB-H1's W of stage d may end after device 0's W does. */
Test(pipeline_schedule, one_micro_batch_is_a_chain) {
    const double tf[4] = {1, 2, 3, 4}, tb[4] = {2, 3, 5, 7}, tw[4] = {0.5, 1, 1.5, 20};
    const double c = 0.25;
    double sum_f = 10, sum_b = 17, sum_w = 23;
    mw__pipe_sched kinds[] = {MW__PIPE_GPIPE, MW__PIPE_1F1B};
    for (int k = 0; k < 2; k++) {
        mw__pipe_schedule s = make(kinds[k], 4, 1, 1);
        double idle[MW_MAX_DEVICES], total = simulate(&s, tf, tb, tw, c, idle);
        cr_assert_float_eq(total, sum_f + sum_b + sum_w + 6 * c, TOL, "kind %d: %g", (int)kinds[k],
                           total);
        for (int d = 0; d < 4; d++)
            cr_assert_float_eq(idle[d], 1 - (tf[d] + tb[d] + tw[d]) / total, TOL);
        mw__pipe_schedule_free(&s);
    }
    /* Interleaved on one device: stages 0..2 in a row, no crossing. */
    mw__pipe_schedule s = make(MW__PIPE_INTERLEAVED, 1, 1, 3);
    cr_assert_float_eq(simulate(&s, tf, tb, NULL, c, NULL), 6 + 10, TOL);
    mw__pipe_schedule_free(&s);
    /* ZB-H1: B of stage d ends at sum_f + 3c + (tb[d] + ... + tb[3]) + (3-d)c, its W tw[d]
     * later; stage 3's W (20) outlasts the chain's remaining backward. */
    s = make(MW__PIPE_ZERO_BUBBLE, 4, 1, 1);
    double want = 0, tail = 0;
    for (int d = 3; d >= 0; d--) {
        tail += tb[d];
        double end = sum_f + 3 * c + tail + (3 - d) * c + tw[d];
        if (end > want) want = end;
    }
    cr_assert_float_eq(simulate(&s, tf, tb, tw, c, NULL), want, TOL);
    cr_assert_float_eq(want, 10 + 0.75 + 7 + 20, TOL);
    mw__pipe_schedule_free(&s);
}

/* --- activations in flight ---------------------------------------------------------------------
 */

Test(pipeline_schedule, inflight) {
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 12; M++) {
            mw__pipe_schedule g = make(MW__PIPE_GPIPE, P, M, 1), f = make(MW__PIPE_1F1B, P, M, 1),
                              z = make(MW__PIPE_ZERO_BUBBLE, P, M, 1);
            for (int d = 0; d < P; d++) {
                int want = P - d < M ? P - d : M;
                cr_assert_eq(mw__pipe_schedule_inflight(&g, d), M);
                cr_assert_eq(mw__pipe_schedule_inflight(&f, d), want, "1F1B P %d M %d device %d", P,
                             M, d);
                cr_assert_leq(mw__pipe_schedule_inflight(&f, d), P - d);
                cr_assert_eq(mw__pipe_schedule_inflight(&z, d), want, "ZB P %d M %d device %d", P,
                             M, d);
            }
            mw__pipe_schedule_free(&g);
            mw__pipe_schedule_free(&f);
            mw__pipe_schedule_free(&z);
        }
    /* Interleaved: the warm-up's forwards and the one of the first pair, at most all M*V. */
    for (int P = 1; P <= 4; P++)
        for (int V = 2; V <= 3; V++)
            for (int M = P; M <= 3 * P; M += P) {
                mw__pipe_schedule s = make(MW__PIPE_INTERLEAVED, P, M, V);
                for (int d = 0; d < P; d++) {
                    int warm = (P - d - 1) * 2 + (V - 1) * P;
                    int want = warm + 1 < M * V ? warm + 1 : M * V;
                    cr_assert_eq(mw__pipe_schedule_inflight(&s, d), want,
                                 "P %d M %d V %d device %d: %d", P, M, V, d,
                                 mw__pipe_schedule_inflight(&s, d));
                }
                mw__pipe_schedule_free(&s);
            }
    /* A W frees nothing that its B has not: F0 B0 W0 F1 F2 holds two at the end. */
    mw__pipe_action zb[] = {{MW__PIPE_F, 0, 0},
                            {MW__PIPE_B, 0, 0},
                            {MW__PIPE_W, 0, 0},
                            {MW__PIPE_F, 1, 0},
                            {MW__PIPE_F, 2, 0}};
    mw__pipe_schedule hand = {.kind = MW__PIPE_ZERO_BUBBLE, .devices = 1, .micro = 3, .chunks = 1};
    hand.nact[0] = 5, hand.act[0] = zb;
    cr_assert_eq(mw__pipe_schedule_inflight(&hand, 0), 2);
    cr_assert_eq(mw__pipe_schedule_inflight(NULL, 0), 0);
    mw__pipe_schedule g = make(MW__PIPE_GPIPE, 2, 3, 1);
    cr_assert_eq(mw__pipe_schedule_inflight(&g, 2), 0);
    cr_assert_eq(mw__pipe_schedule_inflight(&g, -1), 0);
    mw__pipe_schedule_free(&g);
}

/* --- errors ------------------------------------------------------------------------------------
 */

Test(pipeline_schedule, bad_arguments) {
    mw__pipe_schedule s;
    expect_error(mw__pipe_schedule_make(MW__PIPE_1F1B, 4, 0, 1, &s), MW_ERR_INVALID, "micro = 0");
    cr_assert_null(s.act[0]);
    expect_error(mw__pipe_schedule_make(MW__PIPE_1F1B, 4, 8, 2, &s), MW_ERR_INVALID,
                 "chunks = 2, but only the interleaved");
    expect_error(mw__pipe_schedule_make(MW__PIPE_INTERLEAVED, 4, 6, 2, &s), MW_ERR_INVALID,
                 "micro = 6 is not a multiple of devices = 4; Megatron");
    expect_error(mw__pipe_schedule_make(MW__PIPE_INTERLEAVED, 4, 8, 1, &s), MW_ERR_INVALID,
                 "at least 2 chunks");
    expect_error(mw__pipe_schedule_make(MW__PIPE_GPIPE, 0, 8, 1, &s), MW_ERR_INVALID,
                 "devices = 0");
    expect_error(mw__pipe_schedule_make(MW__PIPE_GPIPE, MW_MAX_DEVICES + 1, 8, 1, &s),
                 MW_ERR_INVALID, "devices = 65");
    expect_error(mw__pipe_schedule_make(MW__PIPE_GPIPE, 2, 8, 0, &s), MW_ERR_INVALID, "chunks = 0");
    expect_error(mw__pipe_schedule_make((mw__pipe_sched)7, 2, 8, 1, &s), MW_ERR_INVALID,
                 "unknown kind 7");
    expect_error(mw__pipe_schedule_make(MW__PIPE_GPIPE, 2, 8, 1, NULL), MW_ERR_INVALID, "out");
    expect_error(mw__pipe_schedule_make(MW__PIPE_GPIPE, 2, 1 << 30, 1, &s), MW_ERR_INVALID,
                 "more work");
    mw__pipe_schedule_free(NULL);

    s = make(MW__PIPE_GPIPE, 2, 2, 1);
    double total, neg[2] = {1, -1}, inf[2] = {1, INFINITY};
    expect_error(mw__pipe_schedule_simulate(&s, ones, neg, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "tb[1] = -1");
    expect_error(mw__pipe_schedule_simulate(&s, inf, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "tf[1] = inf");
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, -0.5, &total, NULL),
                 MW_ERR_INVALID, "comm = -0.5");
    expect_error(mw__pipe_schedule_simulate(&s, ones, NULL, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "tb is NULL");
    expect_error(mw__pipe_schedule_simulate(NULL, ones, ones, NULL, 0, &total, NULL),
                 MW_ERR_INVALID, "schedule is NULL");
    mw__pipe_schedule_free(&s);
}

Test(pipeline_schedule, corrupted_schedules) {
    double total = -1;
    /* The last device's B of micro-batch 0 moved before its own F: it waits for that F. */
    mw__pipe_schedule s = make(MW__PIPE_1F1B, 4, 4, 1);
    cr_assert(s.act[3][0].kind == MW__PIPE_F && s.act[3][1].kind == MW__PIPE_B);
    mw__pipe_action t = s.act[3][0];
    s.act[3][0] = s.act[3][1], s.act[3][1] = t;
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "device 3's action 0 (B of micro-batch 0, stage 3) waits for F of micro-batch 0, "
                 "stage 3, which device 3 runs later, at its action 1");
    cr_assert_eq(total, -1);
    mw__pipe_schedule_free(&s);

    /* Device 0 runs B of micro-batch 0 before F of micro-batch 1, which device 1 needs before
     * it sends that backward: a cycle across devices, named where it closes. */
    s = make(MW__PIPE_GPIPE, 2, 2, 1);
    t = s.act[0][1], s.act[0][1] = s.act[0][2], s.act[0][2] = t; /* F0 B0 F1 B1 */
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "device 1's action 1 (F of micro-batch 1, stage 1) waits for F of micro-batch 1, "
                 "stage 0, which device 0 runs at its action 2, but it is stuck at its action 1");
    mw__pipe_schedule_free(&s);

    s = make(MW__PIPE_GPIPE, 2, 2, 1);
    s.act[1][3] = s.act[1][2]; /* B0 twice, no B1 */
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "device 1 runs B of micro-batch 0, chunk 0 twice");
    s.nact[1] = 3;
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "device 1 runs no B of micro-batch 1");
    s.nact[1] = 4;
    s.act[1][3] = (mw__pipe_action){MW__PIPE_W, 1, 0};
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "W only in zero-bubble");
    s.act[1][3] = (mw__pipe_action){MW__PIPE_B, 2, 0};
    expect_error(mw__pipe_schedule_simulate(&s, ones, ones, NULL, 0, &total, NULL), MW_ERR_INVALID,
                 "names micro-batch 2");
    mw__pipe_schedule_free(&s);
}

/* Every allocation of make and simulate failing in turn: NOMEM, nothing left allocated (the
 * leak checker's business) and *out empty; then the same results as without failures. */
Test(pipeline_schedule, allocation_failures) {
    int failures = 0;
    for (int64_t n = 1;; n++) {
        mw__pipe_schedule s;
        double total = -1, idle[4];
        mw_test_control(MW_TEST_FAIL_ALLOCATION, n);
        mw_status st = mw__pipe_schedule_make(MW__PIPE_ZERO_BUBBLE, 4, 8, 1, &s);
        int made = st == MW_OK;
        if (made) st = mw__pipe_schedule_simulate(&s, ones, ones, ones, 0, &total, idle);
        mw_test_control(MW_TEST_FAIL_ALLOCATION, (int64_t)0);
        if (st == MW_OK) {
            cr_assert_float_eq(total, 3.0 * 8 + 3, TOL);
            mw__pipe_schedule_free(&s);
            break;
        }
        cr_assert_eq(st, MW_ERR_NOMEM, "allocation %lld: %s", (long long)n, mw_last_error());
        cr_assert_eq(total, -1);
        for (int d = 0; d < MW_MAX_DEVICES && !made; d++) cr_assert_null(s.act[d]);
        mw__pipe_schedule_free(&s);
        failures++;
    }
    cr_assert_eq(failures, 4 + 5, "%d allocations failed", failures);
}
