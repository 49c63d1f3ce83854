/* Driver of the C Hugging Face tokenizer for tests/hf_tokenizer_test.sh.
 *   helper DIR FILE|add:FILE...    each FILE holds records separated by 0x1E; prints one line of
 *                                  ids per record (add:FILE: with the post-processor's special
 *                                  tokens), and checks on plain FILEs decode(encode(x)) == x (after
 *                                  U+FFFD replacement, and NFC where the file normalizes so)
 *                                  wherever the tokenizer is lossless: always for byte-level
 *                                  BPE; for SentencePiece when x holds no added token's text and
 *                                  no U+2581 (both change what decode gives).
 * Summary on stderr; exit 1 when a round trip fails. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core.h"
#include "data/hf_internal.h"
#include "data/tokenizer.h"

static int lossless(const nb_hf_tokenizer *t, const char *s, size_t n) {
    if (t->byte_level) return 1;
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(s + i, "\xE2\x96\x81", 3)) return 0;
    for (int k = 0; k < t->n_added; k++)
        if (memmem(s, n, t->added[k].text, t->added[k].len)) return 0;
    return 1;
}

static int roundtrip(const nb_hf_tokenizer *t, const char *rec, size_t n, const int32_t *ids, size_t k) {
    size_t clean_len = n, m;
    char *clean = nb_utf8_sanitize(rec, n, &clean_len);
    const char *x = clean ? clean : rec;
    utf8proc_uint8_t *nfc = NULL;
    for (int i = 0; i < t->n_norm; i++)
        if (t->norm[i].kind == HF_NORM_NFC && clean_len) {
            utf8proc_ssize_t l = utf8proc_map((const utf8proc_uint8_t *)x, (utf8proc_ssize_t)clean_len, &nfc,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (l < 0) return 0;
            x = (const char *)nfc, clean_len = (size_t)l;
        }
    char *back = nb_hf_tokenizer_decode(t, ids, k, &m);
    int ok = m == clean_len && !memcmp(back, x, m);
    free(back), free(clean), free(nfc);
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: helper DIR FILE|add:FILE...\n"), 2;
    nb_hf_tokenizer *t = nb_hf_tokenizer_load(argv[1]);
    size_t records = 0, checked = 0, failed = 0, bytes = 0, tokens = 0;
    for (int f = 2; f < argc; f++) {
        int add = !strncmp(argv[f], "add:", 4);
        size_t n;
        char *text = nb_read_file(argv[f] + (add ? 4 : 0), (size_t)1 << 30, &n, NULL);
        for (size_t start = 0; start <= n;) {
            const char *end = memchr(text + start, 0x1E, n - start);
            size_t len = end ? (size_t)(end - text) - start : n - start;
            int32_t *ids;
            size_t k = nb_hf_tokenizer_encode(t, text + start, len, add, &ids);
            for (size_t j = 0; j < k; j++) printf(j ? " %d" : "%d", ids[j]);
            printf("\n");
            if (!add) records++, bytes += len, tokens += k;
            if (!add && lossless(t, text + start, len)) {
                checked++;
                if (!roundtrip(t, text + start, len, ids, k)) {
                    if (failed++ < 3) fprintf(stderr, "decode(encode(x)) != x for record %zu of %s\n", records, argv[f]);
                }
            }
            free(ids);
            start += len + 1;
        }
        free(text);
    }
    fprintf(stderr, "%zu records, %zu bytes, %zu tokens; decode(encode(x)) == x checked on %zu, failed on %zu\n",
            records, bytes, tokens, checked, failed);
    nb_hf_tokenizer_free(t);
    return failed ? 1 : 0;
}
