/* Bench case "tokenize": byte-level BPE (mw_tokenizer_encode) in MB/s of text, one thread,
 * beside Hugging Face `tokenizers` on the same text and tokenizer (bench/peers/hf_tokenize.py, run
 * by the Python in MESHWIT_PEER_PYTHON, default python3, with TOKENIZERS_PARALLELISM=false;
 * skipped, visibly, when it cannot import tokenizers), and whether both gave the same ids.
 *
 * Inputs (environment):
 *   MESHWIT_BENCH_TOKENIZER  a tokenizer.json or a folder (default: the test tokenizer,
 *                            tests/data/tokenizer/tokenizer.json, a vocabulary of 3000; the
 *                            Llama 3 and Qwen2 style ones are llama3.json and qwen2.json there)
 *   MESHWIT_BENCH_TEXT       the text to encode (default: 4 MB, 256 KB with --quick, of
 *                            generated source code and prose, drawn from a fixed seed)
 * The text is encoded whole, in one call, REPEATS times; rows report the median. The
 * first call starts with an empty word cache, the others with the cache the previous left. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "meshwit.h"

#ifndef MWB_SOURCE_DIR
#define MWB_SOURCE_DIR "."
#endif

#define REPEATS 5

/* --- the default text ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Lines of Python-like code and comments: indentation, keywords, identifiers, numbers, strings,
 * operators, English and a little of other scripts. */
static char *generate_text(size_t bytes, size_t *len) {
    static const char *const words[] = {
        "def",      "return",   "self",     "if",       "else:",      "for",    "in",      "range",
        "import",   "from",     "class",    "None",     "True",       "False",  "while",   "not",
        "and",      "or",       "lambda",   "yield",    "value",      "index",  "result",  "count",
        "name",     "path",     "data",     "buffer",   "tokens",     "len",    "print",   "args",
        "kwargs",   "the",      "of",       "a",        "to",         "is",     "that",    "it",
        "with",     "as",       "this",     "we",       "number",     "list",   "string",  "error",
        "_private", "__init__", "get_item", "setValue", "HTTPServer", "x",      "y",       "i",
        "j",        "n",        "über",     "naïve",    "日本語",     "한국어", "données", "ошибка",
        "δ",        "π"};
    static const char *const ops[] = {" = ",  ", ", "(", ")",    ": ",   ".", " + ", " - ",  " * ",
                                      " == ", "[",  "]", " != ", " += ", "'", "\"",  " -> ", "->"};
    const size_t nwords = sizeof words / sizeof *words, nops = sizeof ops / sizeof *ops;
    char *t = malloc(bytes + 256);
    if (!t) return NULL;
    uint64_t s = 20240914;
    size_t k = 0;
    while (k < bytes) {
        int indent = (int)(rng_next(&s) % 4) * 4;
        memset(t + k, ' ', (size_t)indent);
        k += (size_t)indent;
        if (rng_next(&s) % 6 == 0) k += (size_t)sprintf(t + k, "# ");
        int n = 2 + (int)(rng_next(&s) % 10);
        for (int w = 0; w < n && k < bytes; w++) {
            uint64_t r = rng_next(&s);
            if (r % 7 == 0)
                k += (size_t)sprintf(t + k, "%llu", (unsigned long long)(r >> 40));
            else
                k += (size_t)sprintf(t + k, "%s", words[(r >> 8) % nwords]);
            k += (size_t)sprintf(t + k, "%s", r % 3 ? " " : ops[(r >> 20) % nops]);
        }
        t[k++] = '\n';
        if (rng_next(&s) % 9 == 0) t[k++] = '\n';
    }
    *len = k;
    return t;
}

/* The whole of a regular file (opened without blocking: a FIFO is refused, said on stderr). */
static char *read_text(const char *path, size_t *len) {
    FILE *f;
    int64_t n = 0;
    *len = 0;
    if (mw_input_open(path, "MESHWIT_BENCH_TEXT", 0, &f, &n) != MW_OK) {
        fprintf(stderr, "tokenize: %s\n", mw_last_error());
        return NULL;
    }
    char *t = malloc((size_t)n + 1);
    if (t && fread(t, 1, (size_t)n, f) != (size_t)n) {
        free(t);
        t = NULL;
    }
    fclose(f);
    *len = t ? (size_t)n : 0;
    return t;
}

/* The generated text as a file for the peer (complete, or absent). 0, or -1 reported. */
static int write_text(const char *path, const char *text, size_t len) {
    mw_output *out;
    mw_status st = mw_output_open(path, "the generated text", 0, &out);
    if (st == MW_OK && (st = mw_output_write(out, text, len)) != MW_OK) mw_output_abandon(out);
    if (st == MW_OK) st = mw_output_commit(out);
    if (st != MW_OK) fprintf(stderr, "tokenize: %s\n", mw_last_error());
    return st == MW_OK ? 0 : -1;
}

/* --- the peer --------------------------------------------------------------------------------- */

typedef struct peer_result {
    int ok, utf8;
    double mb_per_s, batch_mb_per_s, best;
    long long ids;
    unsigned long crc;
    char name[64];
} peer_result;

static int have_tokenizers(const char *python) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import tokenizers' >/dev/null 2>&1", python);
    return system(cmd) == 0;
}

static void run_peer(const char *python, const char *tokenizer, const char *text, int repeats,
                     peer_result *r) {
    memset(r, 0, sizeof *r);
    char cmd[12288];
    snprintf(cmd, sizeof cmd,
             "TOKENIZERS_PARALLELISM=false '%s' '%s/bench/peers/hf_tokenize.py' --tokenizer '%s' "
             "--text '%s' --repeats %d 2>/dev/null",
             python, MWB_SOURCE_DIR, tokenizer, text, repeats);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    char line[1024], last[1024] = "";
    while (fgets(line, sizeof line, p)) snprintf(last, sizeof last, "%s", line);
    if (pclose(p) != 0) return;
    const char *v;
    if (!(v = strstr(last, "\"mb_per_s\": "))) return;
    r->mb_per_s = strtod(v + 12, NULL);
    if ((v = strstr(last, "\"batch_mb_per_s\": "))) r->batch_mb_per_s = strtod(v + 18, NULL);
    r->best = r->batch_mb_per_s > r->mb_per_s ? r->batch_mb_per_s : r->mb_per_s;
    if ((v = strstr(last, "\"ids\": "))) r->ids = strtoll(v + 7, NULL, 10);
    if ((v = strstr(last, "\"crc32\": "))) r->crc = strtoul(v + 9, NULL, 10);
    r->utf8 = strstr(last, "\"utf8\": true") != NULL;
    if ((v = strstr(last, "\"peer\": \""))) sscanf(v + 9, "%63[^\"]", r->name);
    r->ok = r->mb_per_s > 0.0;
}

/* CRC-32 (zlib's) of the ids as little-endian uint32. */
static unsigned long crc32_ids(const int32_t *ids, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++)
            c = table[(c ^ ((uint32_t)ids[i] >> (8 * b))) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* --- the case --------------------------------------------------------------------------------- */

int mwb_case_tokenize(mwb_ctx *ctx) {
    char tokenizer[4096], textpath[4200] = "", dir[4096] = "";
    const char *t = getenv("MESHWIT_BENCH_TOKENIZER"), *x = getenv("MESHWIT_BENCH_TEXT");
    if (t && *t)
        snprintf(tokenizer, sizeof tokenizer, "%s", t);
    else
        snprintf(tokenizer, sizeof tokenizer, "%s/tests/data/tokenizer/tokenizer.json",
                 MWB_SOURCE_DIR);
    mw_tokenizer *tok;
    if (mw_tokenizer_load(tokenizer, &tok) != MW_OK) {
        fprintf(stderr, "tokenize: %s\n", mw_last_error());
        return 1;
    }
    size_t len = 0;
    char *text;
    int generated = !(x && *x);
    if (generated) {
        text = generate_text(ctx->quick ? (256u << 10) : (4u << 20), &len);
    } else {
        text = read_text(x, &len);
        snprintf(textpath, sizeof textpath, "%s", x);
    }
    if (!text) {
        if (generated) fprintf(stderr, "tokenize: cannot make the text: out of memory\n");
        mw_tokenizer_free(tok);
        return 1;
    }
    size_t cap = mw_tokenizer_max_ids(tok, len), n = 0;
    int32_t *ids = malloc((cap ? cap : 1) * sizeof *ids);
    /* With a normalizer (Qwen2's NFC) the text decoded may be longer than the text */
    size_t back_cap = 3 * len;
    char *back = malloc(back_cap ? back_cap : 1);
    int rc = 0, repeats = ctx->quick ? 1 : REPEATS, normalized = 0;
    double enc[REPEATS], dec[REPEATS];
    for (int r = 0; r < repeats && ids && back && rc == 0; r++) {
        double t0 = mwb_now();
        if (mw_tokenizer_encode(tok, text, len, ids, cap, &n) != MW_OK) rc = 1;
        double t1 = mwb_now();
        size_t got = 0;
        if (!rc && mw_tokenizer_decode(tok, ids, n, back, back_cap, &got) != MW_OK) rc = 1;
        double t2 = mwb_now();
        enc[r] = (double)len / (t1 - t0) / 1e6;
        dec[r] = (double)(got ? got : len) / (t2 - t1) / 1e6;
        if (!rc && r == 0 && (got != len || memcmp(back, text, len) != 0)) {
            /* A normalizer makes decode(encode(x)) the normalized x, which encodes the same. */
            size_t n2 = 0, cap2 = mw_tokenizer_max_ids(tok, got);
            int32_t *again = malloc((cap2 ? cap2 : 1) * sizeof *again);
            normalized = again && mw_tokenizer_encode(tok, back, got, again, cap2, &n2) == MW_OK &&
                         n2 == n && memcmp(again, ids, n * sizeof *ids) == 0;
            free(again);
            if (!normalized) {
                fprintf(stderr, "tokenize: decode(encode(text)) is not the text, nor encodes to "
                                "the same ids\n");
                rc = 1;
            }
        }
    }
    if (!ids || !back)
        fprintf(stderr, "tokenize: out of memory\n"), rc = 1;
    else if (rc && *mw_last_error())
        fprintf(stderr, "tokenize: %s\n", mw_last_error());
    const char *python = getenv("MESHWIT_PEER_PYTHON");
    if (!python || !*python) python = "python3";
    peer_result peer = {0};
    int peers = !rc && !ctx->quick && have_tokenizers(python);
    /* The peer reads the generated text from a file in a folder of this process's own. */
    if (peers && generated && mwb_private_dir(dir, sizeof dir) != 0) peers = 0;
    if (peers && generated) snprintf(textpath, sizeof textpath, "%s/text.txt", dir);
    if (peers && generated && write_text(textpath, text, len) != 0) peers = 0;
    if (peers) run_peer(python, tokenizer, textpath, 3, &peer);
    if (rc == 0) {
        double me = mwb_median(enc, repeats), de = mwb_median(dec, repeats);
        unsigned long crc = crc32_ids(ids, n);
        printf("text: %s, %.2f MB; tokenizer: %s (vocabulary %d), Unicode %s\n",
               generated ? "generated source code and prose" : textpath, (double)len / 1e6,
               tokenizer, mw_tokenizer_vocab_size(tok), mw_tokenizer_unicode_version());
        printf("%-36s %12s %12s %10s\n", "", "encode MB/s", "ids", "ratio");
        printf("%-36s %12.1f %12zu\n", "meshwit (1 thread)", me, n);
        if (peer.ok) {
            char name[96];
            snprintf(name, sizeof name, "%s, encode", peer.name);
            printf("%-36s %12.1f %12lld %9.2fx\n", name, peer.mb_per_s, peer.ids,
                   me / peer.mb_per_s);
            snprintf(name, sizeof name, "%s, encode_batch 4 KB", peer.name);
            printf("%-36s %12.1f %12s %9.2fx\n", name, peer.batch_mb_per_s, "",
                   me / peer.batch_mb_per_s);
            printf("meshwit / the faster of the two: %.2fx\n", me / peer.best);
            printf("ids: %s\n", !peer.utf8 ? "not compared (the text is not UTF-8)"
                                : peer.ids == (long long)n && peer.crc == crc
                                    ? "the same as Hugging Face's (count and CRC-32)"
                                    : "DIFFERENT from Hugging Face's");
        } else {
            printf("peer: %s\n", ctx->quick
                                     ? "skipped in --quick"
                                     : "skipped: MESHWIT_PEER_PYTHON (default python3) cannot "
                                       "import tokenizers, or its run failed");
        }
        printf("meshwit's first call, from an empty word cache: %.1f MB/s; decode: %.1f MB/s\n",
               enc[0], de);
        if (normalized)
            printf("decode(encode(text)) is the text as the tokenizer normalizes it (not the text "
                   "itself), and encodes to the same ids\n");
        mwb_record rec = {0};
        mwb_record_str(&rec, "case", "tokenize");
        mwb_record_str(&rec, "devices", "cpu:1");
        mwb_record_str(&rec, "mode", "meshwit");
        mwb_record_num(&rec, "bytes", (double)len);
        mwb_record_num(&rec, "ids", (double)n);
        mwb_record_num(&rec, "encode_mb_per_s", me);
        mwb_record_num(&rec, "first_call_mb_per_s", enc[0]);
        mwb_record_num(&rec, "decode_mb_per_s", de);
        if (peer.ok) mwb_record_num(&rec, "vs_hf", me / peer.best);
        ctx->emit(ctx, &rec);
        if (peer.ok) {
            mwb_record p = {0};
            mwb_record_str(&p, "case", "tokenize");
            mwb_record_str(&p, "devices", "cpu:1");
            mwb_record_str(&p, "mode", peer.name);
            mwb_record_num(&p, "bytes", (double)len);
            mwb_record_num(&p, "ids", (double)peer.ids);
            mwb_record_num(&p, "encode_mb_per_s", peer.mb_per_s);
            mwb_record_num(&p, "batch_mb_per_s", peer.batch_mb_per_s);
            mwb_record_num(&p, "same_ids",
                           peer.utf8 && peer.ids == (long long)n && peer.crc == crc);
            ctx->emit(ctx, &p);
        }
    }
    if (generated) mwb_private_dir_remove(dir, (const char *const[]){"text.txt", NULL});
    free(ids);
    free(back);
    free(text);
    mw_tokenizer_free(tok);
    return rc;
}
