/* What crosses a pipeline's stages (pipeline_state.h): values and their gradients, a tied
 * parameter's gradient shares and its updated value, and the step's agreement.
 *
 * Between two stages of one process a value stays in its host buffer and a flag says it is
 * written. Between processes (a pipeline axis across processes: each stage's devices in one
 * process) it travels as a message of the link (collectives/dist.h) on its channel: stage s's
 * boundary value j has channel st[s].chan + 2j and its gradient the next one, tied parameter k
 * has p->tied_chan + 2k for the shares and the next for the updated value. A stage's values leave
 * in micro-batch order and its readers take them in that order in every schedule, so a channel's
 * k-th message is micro-batch k's. A send is started and the stage goes on; a receive waits for
 * its message, for a failure of this process, or for a failure message (TAG_ABORT) of another.
 *
 * After the schedule every process posts its status, failure message and the messages it sent on
 * each channel (mw__pipe_link_settle): all then know the step's outcome, and a failed step's
 * messages that were sent but never received are received and dropped, so that the next step's
 * channels start empty. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "parallel/pipeline_impl.h"
#include "parallel/pipeline_state.h"
#include "parallel/trainer_impl.h"

enum { TAG_ABORT = 1, TAG_FIRST = 8 };

/* ---- flags and failures ---------------------------------------------------------------------- */

/* Waits until *flag is set or the step failed; 0 when set. */
static int wait_flag(mw_pipeline *p, const unsigned char *flag) {
    pthread_mutex_lock(&p->mu);
    while (!*flag && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    int bad = !*flag;
    pthread_mutex_unlock(&p->mu);
    return bad;
}

static void set_flag(mw_pipeline *p, unsigned char *flag) {
    pthread_mutex_lock(&p->mu);
    *flag = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Keeps a started send until the step settles. */
static mw_status keep_send(mw_pipeline *p, mw__dist_send *s) {
    pthread_mutex_lock(&p->mu);
    if (p->nsends == p->cap_sends) {
        int cap = p->cap_sends ? 2 * p->cap_sends : 64;
        mw__dist_send **n = mw__realloc(p->sends, (size_t)cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&p->mu);
            /* completed here, so that nothing is left to MPI with nobody waiting for it */
            (void)mw__dist_link_wait(p->link, &s, 1, p->timeout_ms, "mw_pipeline_step");
            return mw__error(MW_ERR_NOMEM, "out of memory keeping a message to another process");
        }
        p->sends = n;
        p->cap_sends = cap;
    }
    p->sends[p->nsends++] = s;
    pthread_mutex_unlock(&p->mu);
    return MW_OK;
}

mw_status mw__pipe_fail(mw_pipeline *p, mw_status st, int s, const char *what) {
    pthread_mutex_lock(&p->mu);
    int first = !p->failed, tell = p->nprocs > 1 && !p->abort_sent;
    if (first) {
        p->failed = st;
        snprintf(p->msg, sizeof p->msg, "stage %d (%s): %s", s, what, mw_last_error());
    }
    p->abort_sent |= tell;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    static const char token = 1;
    for (int q = 0; tell && q < p->nprocs; q++) {
        mw__dist_send *m;
        if (q != p->proc && mw__dist_link_isend(p->link, q, TAG_ABORT, &token, 1, &m) == MW_OK)
            (void)keep_send(p, m);
    }
    return st;
}

static int stopped(void *ctx) {
    mw_pipeline *p = ctx;
    pthread_mutex_lock(&p->mu);
    int f = p->failed != MW_OK;
    pthread_mutex_unlock(&p->mu);
    return f;
}

/* ---- channels -------------------------------------------------------------------------------- */

typedef struct chan_info {
    int from, to; /* processes */
    size_t bytes;
} chan_info;

static chan_info channel(const mw_pipeline *p, int c) {
    if (c >= p->tied_chan) {
        const tied_param *tp = &p->tied[(c - p->tied_chan) / 2];
        int share = (c - p->tied_chan) % 2 == 0, a = p->st[tp->other].proc,
            b = p->st[tp->owner].proc;
        return share ? (chan_info){a, b, (size_t)(tp->shares * tp->count) * sizeof(float)}
                     : (chan_info){b, a, (size_t)tp->count * sizeof(float)};
    }
    int s = 0;
    while (s + 1 < p->S && p->st[s + 1].chan <= c) s++;
    const pipe_out *po = &p->st[s].out[(c - p->st[s].chan) / 2];
    int a = p->st[s].proc, b = p->st[po->reader].proc;
    size_t bytes = (size_t)po->count * sizeof(float);
    return (c - p->st[s].chan) % 2 == 0 ? (chan_info){a, b, bytes} : (chan_info){b, a, bytes};
}

/* Channel c's next message, buf, to its receiving process. */
static mw_status send_raw(mw_pipeline *p, int c, const void *buf) {
    chan_info ci = channel(p, c);
    mw__dist_send *m;
    mw_status st = mw__dist_link_isend(p->link, ci.to, TAG_FIRST + c, buf, ci.bytes, &m);
    if (st == MW_OK) st = keep_send(p, m);
    if (st == MW_OK) p->sent[c]++;
    return st;
}

/* Channel c's next message into buf; abortable: given up when this process fails
 * or another says it did. */
static mw_status recv_raw(mw_pipeline *p, int c, void *buf, int abortable) {
    chan_info ci = channel(p, c);
    char what[96];
    const char *kind = c >= p->tied_chan ? (c - p->tied_chan) % 2 ? "a tied parameter's value"
                                                                  : "a tied parameter's gradient"
                       : c % 2           ? "a gradient"
                                         : "a value";
    snprintf(what, sizeof what, "waiting for %s from process %d", kind, ci.from);
    mw_status st = mw__dist_link_recv(p->link, ci.from, TAG_FIRST + c, buf, ci.bytes,
                                      abortable ? TAG_ABORT : -1, abortable ? stopped : NULL, p,
                                      p->timeout_ms, what);
    if (st == MW_OK) p->recvd[c]++;
    return st;
}

/* The schedule's: a failure is the step's. */
static mw_status send_on(mw_pipeline *p, int c, int s, const void *buf) {
    mw_status st = send_raw(p, c, buf);
    return st ? mw__pipe_fail(p, st, s, "sending") : MW_OK;
}

static mw_status recv_on(mw_pipeline *p, int c, int s, void *buf) {
    mw_status st = recv_raw(p, c, buf, 1);
    if (st == MW_ERR_ABORTED && stopped(p)) return MW_ERR_INTERRUPTED; /* this process's own */
    return st ? mw__pipe_fail(p, st, s, "receiving") : MW_OK;
}

/* ---- the schedule's hand-offs ---------------------------------------------------------------- */

void mw__pipe_link_begin(mw_pipeline *p) {
    p->failed = MW_OK;
    p->msg[0] = '\0';
    for (int s = 0; s < p->S; s++) {
        stage *sg = &p->st[s];
        for (int j = 0; j < sg->nout; j++) memset(sg->out[j].ready, 0, (size_t)p->M);
        for (int k = 0; k < sg->nin; k++) memset(sg->in[k].ready, 0, (size_t)p->M);
    }
    for (int k = 0; k < p->ntied; k++)
        if (p->tied[k].ready) memset(p->tied[k].ready, 0, (size_t)p->M);
    if (p->sent) {
        memset(p->sent, 0, (size_t)p->nchan * sizeof *p->sent);
        memset(p->recvd, 0, (size_t)p->nchan * sizeof *p->recvd);
    }
    p->abort_sent = 0;
}

/* What stage s hands stage `to` in buf, for micro-batch m: in this process a flag that says buf
 * is written, else channel c's message. */
static mw_status hand_over(mw_pipeline *p, int s, int to, unsigned char *flag, int c,
                           const void *buf) {
    if (mw__pipe_local(p, to)) {
        set_flag(p, flag);
        return MW_OK;
    }
    return send_on(p, c, s, buf) ? p->failed : MW_OK;
}

/* What stage s takes from stage `from` into buf: in this process the wait for its flag, else
 * channel c's message. */
static mw_status take_over(mw_pipeline *p, int s, int from, const unsigned char *flag, int c,
                           void *buf) {
    if (mw__pipe_local(p, from)) return wait_flag(p, flag) ? MW_ERR_INTERRUPTED : MW_OK;
    return recv_on(p, c, s, buf);
}

mw_status mw__pipe_values_out(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    mw_status st = MW_OK;
    for (int j = 0; st == MW_OK && j < sg->nout; j++) {
        pipe_out *po = &sg->out[j];
        st = hand_over(p, s, po->reader, &po->ready[m], sg->chan + 2 * j, po->value[m]);
    }
    return st;
}

mw_status mw__pipe_values_in(mw_pipeline *p, int t, int m) {
    stage *sg = &p->st[t];
    mw_status st = MW_OK;
    for (int k = 0; st == MW_OK && k < sg->nin; k++) {
        const pipe_in *pi = &sg->in[k];
        stage *src = &p->st[pi->from];
        pipe_out *po = &src->out[pi->out];
        st = take_over(p, t, pi->from, &po->ready[m], src->chan + 2 * pi->out, po->value[m]);
    }
    return st;
}

mw_status mw__pipe_grads_out(mw_pipeline *p, int t, int m) {
    stage *sg = &p->st[t];
    mw_status st = MW_OK;
    for (int k = 0; st == MW_OK && k < sg->nin; k++) {
        pipe_in *pi = &sg->in[k];
        st = hand_over(p, t, pi->from, &pi->ready[m], p->st[pi->from].chan + 2 * pi->out + 1,
                       pi->grad[m]);
    }
    for (int k = 0; st == MW_OK && k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        if (tp->other == t)
            st = hand_over(p, t, tp->owner, &tp->ready[m], p->tied_chan + 2 * k, tp->share[m]);
    }
    return st;
}

mw_status mw__pipe_grads_in(mw_pipeline *p, int s, int m) {
    stage *sg = &p->st[s];
    mw_status st = MW_OK;
    for (int j = 0; st == MW_OK && j < sg->nout; j++) {
        const pipe_out *po = &sg->out[j];
        pipe_in *pi = &p->st[po->reader].in[po->in];
        st = take_over(p, s, po->reader, &pi->ready[m], sg->chan + 2 * j + 1, pi->grad[m]);
    }
    for (int k = 0; st == MW_OK && k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        if (tp->owner == s)
            st = take_over(p, s, tp->other, &tp->ready[m], p->tied_chan + 2 * k, tp->share[m]);
    }
    return st;
}

/* ---- agreement between processes ------------------------------------------------------------- */

/* What each process posts when a phase ends. */
typedef struct posted {
    int32_t status, aborted;
    char msg[MW__MSG_SIZE];
} posted;

/* Every process's record of `bytes` (a posted, then what follows it) into all (nprocs of them). */
static mw_status post_all(mw_pipeline *p, const void *mine, size_t bytes, void *all,
                          const char *what) {
    int *counts = mw__malloc((size_t)p->nprocs * sizeof *counts);
    if (!counts) return mw__error(MW_ERR_NOMEM, "%s: out of memory", what);
    for (int q = 0; q < p->nprocs; q++) counts[q] = (int)bytes;
    mw_status st = mw__dist_allgatherv_bytes(mine, counts, all, p->timeout_ms, what);
    mw__free(counts);
    return st;
}

/* The failure to report among the posted records (stride bytes apart): the first process's that
 * is not a reaction to another's (MW_ERR_ABORTED, MW_ERR_INTERRUPTED), else the first at all. */
static int root_cause(const mw_pipeline *p, const char *all, size_t stride) {
    int any = -1;
    for (int q = 0; q < p->nprocs; q++) {
        const posted *r = (const posted *)(const void *)(all + (size_t)q * stride);
        if (r->status == MW_OK) continue;
        if (any < 0) any = q;
        if (r->status != MW_ERR_ABORTED && r->status != MW_ERR_INTERRUPTED) return q;
    }
    return any;
}

static mw_status wait_sends(mw_pipeline *p, const char *what) {
    mw_status st = mw__dist_link_wait(p->link, p->sends, p->nsends, p->timeout_ms, what);
    p->nsends = 0;
    return st;
}

/* Receives and drops a failed step's messages that were sent to this process and not received. */
static mw_status drain(mw_pipeline *p, const char *all, size_t stride) {
    size_t most = 1;
    for (int c = 0; c < p->nchan; c++) {
        chan_info ci = channel(p, c);
        if (ci.to == p->proc && ci.bytes > most) most = ci.bytes;
    }
    char *junk = mw__malloc(most);
    if (!junk) return mw__error(MW_ERR_NOMEM, "out of memory draining");
    mw_status st = MW_OK;
    for (int q = 0; q < p->nprocs && st == MW_OK; q++) {
        const posted *r = (const posted *)(const void *)(all + (size_t)q * stride);
        if (q != p->proc && r->aborted)
            st = mw__dist_link_recv(p->link, q, TAG_ABORT, junk, 1, -1, NULL, NULL, p->timeout_ms,
                                    "draining a failure message");
    }
    for (int c = 0; c < p->nchan && st == MW_OK; c++) {
        chan_info ci = channel(p, c);
        if (ci.to != p->proc || ci.from == p->proc) continue;
        const int32_t *sent =
            (const int32_t *)(const void *)(all + (size_t)ci.from * stride + sizeof(posted));
        for (int k = p->recvd[c]; k < sent[c] && st == MW_OK; k++)
            st = mw__dist_link_recv(p->link, ci.from, TAG_FIRST + c, junk, ci.bytes, -1, NULL, NULL,
                                    p->timeout_ms, "draining a message");
    }
    mw__free(junk);
    return st;
}

mw_status mw__pipe_link_settle(mw_pipeline *p, mw_status st) {
    if (p->nprocs == 1) return st;
    size_t stride = sizeof(posted) + (size_t)p->nchan * sizeof(int32_t);
    stride = (stride + 7) / 8 * 8;
    char *mine = mw__calloc(1, stride), *all = mw__calloc((size_t)p->nprocs, stride);
    mw_status agreed = mine && all ? MW_OK : mw__error(MW_ERR_NOMEM, "out of memory");
    if (agreed == MW_OK) {
        posted *r = (posted *)(void *)mine;
        r->status = st;
        r->aborted = p->abort_sent;
        snprintf(r->msg, sizeof r->msg, "%s", st ? p->msg : "");
        int32_t *sent = (int32_t *)(void *)(mine + sizeof(posted));
        for (int c = 0; c < p->nchan; c++) sent[c] = p->sent[c];
        agreed = post_all(p, mine, stride, all, "the processes' outcomes");
    }
    if (agreed == MW_OK) {
        int q = root_cause(p, all, stride);
        if (q >= 0) {
            const posted *r = (const posted *)(const void *)(all + (size_t)q * stride);
            agreed = r->status;
            char msg[MW__MSG_SIZE];
            snprintf(msg, sizeof msg, "%s", r->msg);
            snprintf(p->msg, sizeof p->msg, "process %d, %.*s", q, MW__MSG_SIZE - 32, msg);
            mw_status dst = drain(p, all, stride);
            if (dst)
                snprintf(p->msg + strlen(p->msg), sizeof p->msg - strlen(p->msg),
                         " (and draining the step's messages: %s)", mw_last_error());
        }
    } else if (st) { /* this process's own failure first, what followed after it */
        size_t n = strlen(p->msg);
        snprintf(p->msg + n, sizeof p->msg - n, " (then, telling the other processes: %s)",
                 mw_last_error());
        agreed = st;
    } else {
        snprintf(p->msg, sizeof p->msg, "%s", mw_last_error());
    }
    mw_status wst = wait_sends(p, "completing the messages to other processes");
    if (agreed == MW_OK && wst) {
        agreed = wst;
        snprintf(p->msg, sizeof p->msg, "%s", mw_last_error());
    }
    mw__free(mine);
    mw__free(all);
    return agreed;
}

mw_status mw__pipe_link_agree(mw_pipeline *p, mw_status st, const char *msg, char *out, size_t size,
                              int *ok_procs) {
    *ok_procs = st == MW_OK;
    if (p->nprocs == 1) {
        snprintf(out, size, "%s", st ? msg : "");
        return st;
    }
    posted mine = {.status = st}, *all = mw__calloc((size_t)p->nprocs, sizeof *all);
    if (!all) return mw__error(MW_ERR_NOMEM, "out of memory");
    snprintf(mine.msg, sizeof mine.msg, "%s", st ? msg : "");
    mw_status got = post_all(p, &mine, sizeof mine, all, "the processes' updates");
    if (got) {
        snprintf(out, size, "%s", mw_last_error());
        mw__free(all);
        return got;
    }
    int q = root_cause(p, (const char *)all, sizeof *all);
    *ok_procs = 0;
    for (int i = 0; i < p->nprocs; i++) *ok_procs += all[i].status == MW_OK;
    mw_status agreed = q >= 0 ? all[q].status : MW_OK;
    if (q >= 0) snprintf(out, size, "process %d, %.*s", q, MW__MSG_SIZE - 32, all[q].msg);
    mw__free(all);
    return agreed;
}

mw_status mw__pipe_link_norms(mw_pipeline *p) {
    if (p->nprocs == 1) return MW_OK;
    float *all = mw__calloc((size_t)p->nprocs * (size_t)p->S, sizeof *all);
    if (!all) return mw__error(MW_ERR_NOMEM, "out of memory");
    mw_status st = post_all(p, p->norms, (size_t)p->S * sizeof *all, all,
                            "the pipeline's gradient norm across processes");
    for (int s = 0; st == MW_OK && s < p->S; s++)
        p->norms[s] = all[(size_t)p->st[s].proc * (size_t)p->S + (size_t)s];
    mw__free(all);
    return st;
}

mw_status mw__pipe_link_bcast(mw_pipeline *p, int root, void *buf, size_t n, const char *what) {
    if (p->nprocs == 1 || n == 0) return MW_OK;
    const size_t chunk = (size_t)1 << 30;
    int *counts = mw__calloc((size_t)p->nprocs, sizeof *counts);
    char *tmp = mw__malloc(n < chunk ? n : chunk);
    mw_status st = counts && tmp ? MW_OK : mw__error(MW_ERR_NOMEM, "%s: out of memory", what);
    for (size_t off = 0; st == MW_OK && off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk;
        counts[root] = (int)len;
        st = mw__dist_allgatherv_bytes((const char *)buf + off, counts, tmp, p->timeout_ms, what);
        if (st == MW_OK && p->proc != root) memcpy((char *)buf + off, tmp, len);
    }
    mw__free(counts);
    mw__free(tmp);
    return st;
}

mw_status mw__pipe_link_losses(mw_pipeline *p, float *buf) {
    const stage *last = &p->st[p->S - 1];
    if (last->losses && mw__pipe_local(p, p->S - 1))
        memcpy(buf, last->losses, (size_t)p->M * sizeof *buf);
    return mw__pipe_link_bcast(p, last->proc, buf, (size_t)p->M * sizeof *buf,
                               "the pipeline's losses across processes");
}

mw_status mw__pipe_link_tied(mw_pipeline *p) {
    mw_status st = MW_OK;
    for (int k = 0; st == MW_OK && k < p->ntied; k++) {
        tied_param *tp = &p->tied[k];
        const char *name = p->g->nodes[tp->node]->name;
        int mine = mw__pipe_local(p, tp->owner), theirs = mw__pipe_local(p, tp->other);
        if (mine) st = mw_trainer_read_param(p->st[tp->owner].tr, name, tp->value, tp->count);
        if (st == MW_OK && mine && !theirs) st = send_raw(p, p->tied_chan + 2 * k + 1, tp->value);
        if (st == MW_OK && !mine && theirs)
            st = recv_raw(p, p->tied_chan + 2 * k + 1, tp->value, 0);
        if (st == MW_OK && theirs)
            st = mw_trainer_write_param(p->st[tp->other].tr, name, tp->value, tp->count);
        if (st)
            snprintf(p->msg, sizeof p->msg, "copying the updated '%s' to stage %d: %s", name,
                     tp->other, mw_last_error());
    }
    if (p->nprocs > 1) {
        mw_status wst = wait_sends(p, "sending the tied parameters");
        if (st == MW_OK && wst) {
            st = wst;
            snprintf(p->msg, sizeof p->msg, "%s", mw_last_error());
        }
    }
    return st;
}

/* ---- making ---------------------------------------------------------------------------------- */

mw_status mw__pipe_link_open(mw_pipeline *p) {
    int c = 0;
    for (int s = 0; s < p->S; s++) {
        p->st[s].chan = c;
        c += 2 * p->st[s].nout;
    }
    p->tied_chan = c;
    p->nchan = c + 2 * p->ntied;
    if (p->nprocs == 1) return MW_OK;
    if (TAG_FIRST + p->nchan > 32767) /* the least tag bound MPI promises */
        return mw__error(MW_ERR_UNSUPPORTED,
                         "mw_pipeline_new: %d channels between stages; at most %d across "
                         "processes",
                         p->nchan, 32767 - TAG_FIRST);
    p->sent = mw__calloc((size_t)p->nchan + 1, sizeof *p->sent);
    p->recvd = mw__calloc((size_t)p->nchan + 1, sizeof *p->recvd);
    if (!p->sent || !p->recvd) return mw__error(MW_ERR_NOMEM, "mw_pipeline_new: out of memory");
    return mw__dist_link_new(&p->link);
}

void mw__pipe_link_close(mw_pipeline *p) {
    if (p->nsends) (void)wait_sends(p, "mw_pipeline_free");
    mw__free(p->sends);
    mw__free(p->sent);
    mw__free(p->recvd);
    mw__dist_link_free(p->link);
}
