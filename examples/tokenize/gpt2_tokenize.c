/* gpt2-tokenize: text to GPT-2 token ids (an llm.c token shard), and a shard back to text, with
 * meshwit's byte-level BPE tokenizer (meshwit/tokenizer.h), which gives the ids Hugging Face
 * tokenizers gives.
 *
 *   gpt2-tokenize --tokenizer tokenizer.json --out train.bin --val-fraction 0.1 \
 *       --val-out val.bin book1.txt book2.txt
 *   gpt2-tokenize --tokenizer tokenizer.json --decode train.bin
 *
 * Each TEXT is a document: its tokens follow the end-of-text token, as llm.c's data scripts
 * write them. The shard is llm.c's: a header of 256 little-endian int32 (20240520, version 1,
 * the token count, zeros) and then the tokens as little-endian uint16, so a vocabulary must fit
 * 65536 ids. Every file goes through the library's discipline (meshwit/file.h): the
 * tokenizer's files, the texts and the shard read are regular files (or "-"), opened without
 * blocking; each output is checked before any work (no input, not the other output, no FIFO,
 * device, folder or read-only file, a folder that takes a new file, room for the most the
 * shards can take) and written to a temporary file beside it, renamed over it only once
 * complete, so a failed run leaves every file as it was.
 *
 * Exit status: 0 done; 1 the work failed (a text that cannot be read or tokenized, a tokenizer
 * that cannot write a shard: a byte without a token, more than 65536 ids; a shard that cannot be
 * decoded, an output that cannot be written); 2 bad arguments: a bad flag, a tokenizer that
 * cannot be loaded, a file refused before the work (an input that cannot be read, an output
 * that is an input or the other output, not a regular file, read-only, in a folder that takes
 * no file, without room for the shards, an empty name). */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../common/cli.h"
#include "../common/gpt2_data.h"
#include "../common/options.h"
#include "meshwit.h"

#define PROGRAM "gpt2-tokenize"
#define SHARD_MAX_VOCAB 65536      /* uint16 tokens */
#define SHARD_MAX_TOKENS INT32_MAX /* header[2] is an int32 */

typedef struct options {
    const char *tokenizer, *out, *val_out, *decode, *eot;
    double val_fraction;
    int have_fraction; /* --val-fraction given */
    int no_eot;
    const char **texts;
    int ntexts;
} options;

#define F(field) offsetof(options, field)
#define STR(x) #x
#define XSTR(x) STR(x)

static const cli_option table[] = {
    CLI_OPT("--tokenizer", CLI_STRING, F(tokenizer), NULL, "PATH",
            "a Hugging Face tokenizer.json, or a folder holding one, or a folder holding GPT-2's "
            "vocab.json and merges.txt"),
    CLI_OPT("--out", CLI_STRING, F(out), NULL, "SHARD",
            "write the tokens as an llm.c token shard: 256 int32 (20240520, 1, the count, "
            "zeros), then uint16 tokens, little-endian. Without it the ids are printed, one line "
            "per TEXT"),
    CLI_OPT("--val-fraction", CLI_DOUBLE, F(val_fraction), NULL, "F",
            "the last F of the tokens (0 < F < 1) go to --val-out instead, as the gpt2 example's "
            "--val-fraction splits a shard",
            .min = 0, .max = 1, .flags = CLI_ABOVE_MIN | CLI_BELOW_MAX, .given = F(have_fraction)),
    CLI_OPT("--val-out", CLI_STRING, F(val_out), NULL, "SHARD2",
            "the validation shard (needs --val-fraction and --out)"),
    CLI_OPT("--eot", CLI_STRING, F(eot), NULL, "TOKEN",
            "the token put before each TEXT, to separate documents as llm.c's data scripts do "
            "(default: <|endoftext|> when the tokenizer has it, else none)"),
    CLI_OPT("--no-eot", CLI_FLAG, F(no_eot), NULL, NULL, "no token between documents"),
    CLI_OPT("--decode", CLI_STRING, F(decode), NULL, "SHARD",
            "print the text of a token shard (to --out FILE if given); the bytes exactly as the "
            "tokens spell them, even where they are not UTF-8"),
};

/* A TEXT to encode: every argument that is no option ("-" included). 0, or 1 (out of memory,
 * reported). */
static int add_text(void *opts, const char *arg) {
    options *o = opts;
    const char **texts = realloc(o->texts, (size_t)(o->ntexts + 1) * sizeof *texts);
    if (!texts) {
        fprintf(stderr, PROGRAM ": out of memory\n");
        return 1;
    }
    o->texts = texts;
    o->texts[o->ntexts++] = arg;
    return 0;
}

static const cli_program program = {
    PROGRAM,
    sizeof(options),
    table,
    CLI_COUNT(table),
    "usage: " PROGRAM " --tokenizer PATH [--out SHARD] [--val-fraction F --val-out SHARD2]\n"
    "                     [--eot TOKEN | --no-eot] TEXT...\n"
    "       " PROGRAM " --tokenizer PATH --decode SHARD [--out FILE]\n"
    "\n"
    "Encodes each TEXT file (- for standard input) into GPT-2 token ids with a byte-level\n"
    "BPE tokenizer, exactly as Hugging Face tokenizers encodes it, and writes them as an\n"
    "llm.c token shard (or prints them); or decodes a shard back to its text.\n"
    "\n",
    "\n"
    "A token shard holds uint16 ids: a tokenizer with more than " XSTR(
        SHARD_MAX_VOCAB) " ids cannot write\n"
                         "one (print the ids instead). decode(encode(text)) gives the text back "
                         "byte for byte,\n"
                         "and a tokenizer lacking a token for some byte (which encoding would "
                         "drop) is refused\n"
                         "for --out. --out - writes standard output. Every output is checked "
                         "before any work\n"
                         "(not an input or the other output, not a FIFO, device, folder or "
                         "read-only file, in a\n"
                         "folder that takes a new file, with room) and replaced only by the "
                         "complete file.\n"
                         "Exit status: 0 done, 1 the work failed (a text that cannot be read or "
                         "tokenized, a\n"
                         "tokenizer that cannot write a shard, a shard that cannot be decoded, an "
                         "output that\n"
                         "cannot be written), 2 bad arguments (also a tokenizer that cannot be "
                         "loaded and every\n"
                         "file refused before the work).\n",
    add_text,
};

/* 0 ok, 1 --help (the usage printed), -1 bad arguments (reported). */
static int parse_args(int argc, char **argv, options *o) {
    int rc = cli_parse(&program, argc, argv, o);
    if (rc > 0) cli_usage(&program, stdout);
    if (rc != 0) return rc;
    const int have_fraction = o->have_fraction;
    const char *why = !o->tokenizer            ? "--tokenizer PATH is required"
                      : o->decode && o->ntexts ? "--decode takes no TEXT"
                      : o->decode && (have_fraction || o->val_out || o->eot || o->no_eot)
                          ? "--decode takes only --out"
                      : !o->decode && !o->ntexts      ? "no TEXT to encode"
                      : have_fraction != !!o->val_out ? "--val-fraction and --val-out go together"
                      : o->val_out && !o->out         ? "--val-out needs --out"
                      : o->eot && o->no_eot           ? "--eot and --no-eot contradict each other"
                                                      : NULL;
    if (why) {
        fprintf(stderr, PROGRAM ": %s (see --help)\n", why);
        return -1;
    }
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, PROGRAM ": %s%s%s\n", what, *mw_last_error() ? ": " : "", mw_last_error());
    return 1;
}

/* The most bytes the shards can take: a header and two bytes per id, the ids of each text (and
 * its end-of-text token) at most mw_tokenizer_max_ids of its size; split by --val-fraction as
 * encode_all splits them (one id either way for the rounding). 0 for each when standard input
 * is a text (its size is not known). */
static void shard_bounds(const options *o, const mw_tokenizer *tok, int64_t *train, int64_t *val) {
    *train = *val = 0;
    double ids = 0;
    for (int t = 0; t < o->ntexts; t++) {
        struct stat sb;
        if (strcmp(o->texts[t], "-") == 0 || stat(o->texts[t], &sb) != 0) return;
        ids += (double)mw_tokenizer_max_ids(tok, (size_t)sb.st_size) + 1;
    }
    double f = o->val_out ? o->val_fraction : 0.0;
    *train = (int64_t)(GPT2_HEADER_INTS * 4 + 2 * (ids * (1.0 - f) + 1));
    *val = o->val_out ? (int64_t)(GPT2_HEADER_INTS * 4 + 2 * (ids * f + 1)) : 0;
}

/* Every file of the run, checked before any work: the tokenizer's files, the texts or the shard
 * read are inputs; --out and --val-out outputs, with room for the most the shards can take (a
 * decoded text's size is known only once decoded). 0, or 2 reported: a file refused before the
 * work is a bad argument, whatever the refusal. */
static int check_files(const options *o, const mw_tokenizer *tok) {
    int64_t train = 0, val = 0;
    if (!o->decode) shard_bounds(o, tok, &train, &val);
    mw_file_set *fs;
    mw_status st = mw_file_set_new(&fs);
    for (int i = 0; !st && mw_tokenizer_file(tok, i); i++)
        st = mw_file_set_add_input(fs, mw_tokenizer_file(tok, i), "--tokenizer", 0);
    for (int t = 0; !st && t < o->ntexts; t++)
        st = mw_file_set_add_input(fs, o->texts[t], "TEXT", MW_FILE_STDIO);
    if (!st && o->decode) st = mw_file_set_add_input(fs, o->decode, "--decode", 0);
    if (!st && o->out) st = mw_file_set_add_output(fs, o->out, "--out", MW_FILE_STDIO, train);
    if (!st && o->val_out)
        st = mw_file_set_add_output(fs, o->val_out, "--val-out", MW_FILE_STDIO, val);
    mw_file_set_free(fs);
    if (!st) return 0;
    fprintf(stderr, PROGRAM ": %s\n", mw_last_error());
    return 2;
}

/* The whole of `path` ("-": standard input) into *data (*len bytes). 0, or 1 reported. */
static int read_text(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f;
    if (mw_input_open(path, "TEXT", MW_FILE_STDIO, &f, NULL) != MW_OK) {
        fprintf(stderr, PROGRAM ": %s\n", mw_last_error());
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, PROGRAM ": out of memory reading %s\n", path);
            break;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *grown = cap <= SIZE_MAX / 2 ? realloc(buf, cap *= 2) : NULL;
        if (!grown) free(buf);
        buf = grown;
    }
    int bad = !buf || ferror(f);
    if (buf && ferror(f)) fprintf(stderr, PROGRAM ": cannot read %s: %s\n", path, strerror(errno));
    fclose(f);
    if (bad) {
        free(buf);
        return 1;
    }
    *data = buf;
    *len = n;
    return 0;
}

/* An llm.c token shard of ids[0, n) written beside path (the flag `what`) and synced to the disk;
 * mw_output_commit renames it over path. 0 and *out, or 1 reported. */
static int write_shard(const char *what, const char *path, const int32_t *ids, size_t n,
                       mw_output **out) {
    mw_status st = mw_output_open(path, what, MW_FILE_STDIO, out);
    if (st != MW_OK) return fail("cannot write the shard");
    unsigned char header[GPT2_HEADER_INTS * 4] = {0};
    const int32_t fields[3] = {GPT2_SHARD_MAGIC, GPT2_SHARD_VERSION, (int32_t)n};
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < 4; b++)
            header[4 * k + b] = (unsigned char)((uint32_t)fields[k] >> 8 * b);
    st = mw_output_write(*out, header, sizeof header);
    unsigned char chunk[8192];
    for (size_t i = 0; i < n && st == MW_OK;) {
        size_t m = 0;
        for (; i < n && m < sizeof chunk; i++) {
            chunk[m++] = (unsigned char)(ids[i] & 0xFF);
            chunk[m++] = (unsigned char)(ids[i] >> 8);
        }
        st = mw_output_write(*out, chunk, m);
    }
    if (st == MW_OK) st = mw_output_sync(*out);
    if (st == MW_OK) return 0;
    mw_output_abandon(*out);
    *out = NULL;
    return fail("cannot write the shard");
}

/* Both shards are complete on the disk before either replaces its final name: a failure (a
 * full disk) leaves both as they were. 0, or 1 reported. */
static int write_shards(const options *o, const int32_t *ids, size_t ntrain, size_t nval) {
    mw_output *train = NULL, *val = NULL;
    if (write_shard("--out", o->out, ids, ntrain, &train) != 0) return 1;
    if (o->val_out && write_shard("--val-out", o->val_out, ids + ntrain, nval, &val) != 0) {
        mw_output_abandon(train);
        return 1;
    }
    mw_status st = mw_output_commit(train);
    if (st == MW_OK && val)
        st = mw_output_commit(val);
    else
        mw_output_abandon(val);
    return st == MW_OK ? 0 : fail("cannot write the shard");
}

static int encode_all(const options *o, mw_tokenizer *tok) {
    int32_t eot = -1;
    const char *eot_name = o->eot ? o->eot : "<|endoftext|>";
    if (!o->no_eot && mw_tokenizer_token_id(tok, eot_name, &eot) != MW_OK && o->eot)
        return fail("--eot");
    int missing = mw_tokenizer_missing_byte(tok);
    if (o->out && missing >= 0) {
        fprintf(stderr,
                PROGRAM ": the tokenizer %s has no token for byte 0x%02x (nor byte fallback): "
                        "encoding drops it, so a shard would not decode to its text; use a "
                        "tokenizer with the 256 byte tokens (as GPT-2's), or print the ids (no "
                        "--out)\n",
                o->tokenizer, missing);
        return 1;
    }
    if (o->out && mw_tokenizer_vocab_size(tok) > SHARD_MAX_VOCAB) {
        fprintf(stderr,
                PROGRAM ": the tokenizer %s has %d ids, but an llm.c token shard stores uint16 "
                        "ids, at most %d (ids 0 to %d): print the ids instead (no --out)\n",
                o->tokenizer, mw_tokenizer_vocab_size(tok), SHARD_MAX_VOCAB, SHARD_MAX_VOCAB - 1);
        return 1;
    }
    int32_t *all = NULL;
    size_t count = 0, cap = 0;
    int rc = 0;
    for (int t = 0; t < o->ntexts && rc == 0; t++) {
        char *text;
        size_t len, n;
        if (read_text(o->texts[t], &text, &len)) return free(all), 1;
        size_t need = mw_tokenizer_max_ids(tok, len) + 1;
        if (need > SIZE_MAX / sizeof *all - count) {
            fprintf(stderr, PROGRAM ": %s: too large to tokenize in memory\n", o->texts[t]);
            free(text);
            free(all);
            return 1;
        }
        if (count + need > cap) {
            size_t grown_cap = cap * 2 > count + need ? cap * 2 : count + need;
            int32_t *grown = realloc(all, grown_cap * sizeof *all);
            if (!grown) {
                fprintf(stderr, PROGRAM ": out of memory for the ids of %s\n", o->texts[t]);
                free(text);
                free(all);
                return 1;
            }
            all = grown;
            cap = grown_cap;
        }
        size_t start = count;
        if (eot >= 0) all[count++] = eot;
        mw_status st = mw_tokenizer_encode(tok, text, len, all + count, cap - count, &n);
        free(text);
        if (st != MW_OK) {
            char what[4200];
            snprintf(what, sizeof what, "cannot tokenize %s", o->texts[t]);
            rc = fail(what);
            break;
        }
        count += n;
        if (!o->out) {
            for (size_t i = start; i < count; i++) printf("%s%d", i > start ? " " : "", all[i]);
            printf("\n");
        }
    }
    if (rc == 0 && o->out) {
        size_t nval = o->val_out ? (size_t)((double)count * o->val_fraction) : 0;
        size_t ntrain = count - nval;
        if (ntrain > SHARD_MAX_TOKENS || nval > SHARD_MAX_TOKENS) {
            fprintf(stderr,
                    PROGRAM ": %zu tokens: an llm.c token shard holds at most %d (its count is "
                            "an int32); split the text into several shards\n",
                    ntrain > nval ? ntrain : nval, SHARD_MAX_TOKENS);
            rc = 1;
        } else if (count == 0 || (o->val_out && (nval == 0 || ntrain == 0))) {
            fprintf(stderr, PROGRAM ": %zu tokens in all%s: a token shard cannot be empty\n", count,
                    o->val_out ? ", too few to split by --val-fraction" : "");
            rc = 1;
        } else {
            rc = write_shards(o, all, ntrain, nval);
            if (rc == 0) {
                fprintf(stderr, PROGRAM ": %zu tokens to %s", ntrain, o->out);
                if (o->val_out) fprintf(stderr, ", %zu to %s", nval, o->val_out);
                fprintf(stderr, "\n");
            }
        }
    }
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, PROGRAM ": cannot write the ids: %s\n", strerror(errno));
        rc = 1;
    }
    free(all);
    return rc;
}

static int decode_shard(const options *o, mw_tokenizer *tok) {
    gpt2_tokens t;
    char err[1024];
    if (gpt2_tokens_load_shard(o->decode, &t, err, sizeof err) != MW_OK) {
        fprintf(stderr, PROGRAM ": %s\n", err);
        return 1;
    }
    int32_t *ids = malloc((size_t)t.count * sizeof *ids);
    size_t len = 0;
    if (!ids) {
        gpt2_tokens_free(&t);
        fprintf(stderr, PROGRAM ": out of memory decoding %s\n", o->decode);
        return 1;
    }
    size_t n = (size_t)t.count;
    for (size_t i = 0; i < n; i++) ids[i] = t.ids[i];
    gpt2_tokens_free(&t);
    mw_status st = mw_tokenizer_decode(tok, ids, n, NULL, 0, &len);
    char *text = st == MW_ERR_SHAPE || st == MW_OK ? malloc(len ? len : 1) : NULL;
    if ((st == MW_ERR_SHAPE || st == MW_OK) && !text) {
        free(ids);
        fprintf(stderr, PROGRAM ": out of memory for the %zu bytes of %s\n", len, o->decode);
        return 1;
    }
    if (st == MW_ERR_SHAPE) st = mw_tokenizer_decode(tok, ids, n, text, len, &len);
    free(ids);
    if (st != MW_OK) {
        free(text);
        char what[4200];
        snprintf(what, sizeof what, "cannot decode %s", o->decode);
        return fail(what);
    }
    mw_output *out;
    st = mw_output_open(o->out ? o->out : "-", o->out ? "--out" : "the text", MW_FILE_STDIO, &out);
    if (st == MW_OK && (st = mw_output_write(out, text, len)) != MW_OK) mw_output_abandon(out);
    if (st == MW_OK) st = mw_output_commit(out);
    free(text);
    return st == MW_OK ? 0 : fail("cannot write the text");
}

int main(int argc, char **argv) {
    options o;
    int r = parse_args(argc, argv, &o);
    if (r) {
        free(o.texts);
        return r > 0 ? 0 : 2;
    }
    mw_tokenizer *tok;
    if (mw_tokenizer_load(o.tokenizer, &tok) != MW_OK) {
        free(o.texts);
        fail("cannot load the tokenizer");
        return 2;
    }
    int rc = check_files(&o, tok);
    if (rc == 0) rc = o.decode ? decode_shard(&o, tok) : encode_all(&o, tok);
    mw_tokenizer_free(tok);
    free(o.texts);
    return rc;
}
