/* The tokenizer's long-word path (a heap of pairs, O(m log m)) against the plain quadratic
 * merge loop it replaces, on words long enough to take it: random letters, digits, the
 * punctuation whose pairs merge through the reference's ','-joined lookup, CJK, and mixed texts
 * of long and short words; decode(encode(x)) == x; and a 2 MB run of letters without a space
 * (79 s before; must take seconds). Needs data/gpt2 (scripts/fetch_data.sh tokenizer); skips
 * without it. tests/tokenizer_test.sh checks such words against OpenAI's encoder itself. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "core.h"
#include "data/tokenizer.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* n bytes drawn from the pieces of alphabet (each piece one or more bytes, kept whole). */
static char *random_text(const char *const *alphabet, int k, size_t n, size_t *len) {
    char *s = malloc(n + 8);
    size_t o = 0;
    while (o < n) {
        const char *p = alphabet[next_u32() % (uint32_t)k];
        size_t l = strlen(p);
        memcpy(s + o, p, l);
        o += l;
    }
    *len = o;
    return s;
}

static int same_ids(const nb_tokenizer *t, const char *text, size_t n, size_t *count) {
    int32_t *a, *b;
    size_t na = nb_tokenizer_encode(t, text, n, &a);
    size_t nbr = nb_tokenizer_encode_reference(t, text, n, &b);
    int ok = na == nbr && !memcmp(a, b, na * sizeof *a);
    size_t m;
    char *back = nb_tokenizer_decode(t, a, na, &m);
    ok &= m == n && !memcmp(back, text, n);
    free(back), free(a), free(b);
    *count = na;
    return ok;
}

static const nb_tokenizer *tok;

TEST_CASE(long_words_match_the_quadratic_loop) {
    static const char *letters[] = {"a", "b", "c", "d", "e", "t", "h", "i", "n", "o", "s", "r", "q", "z", "x"};
    static const char *digits[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
    static const char *punct[] = {"\"", ",", "\"", ".", "'", "-", "=", "(", ")", "!", "?", ":", ";", "*", "#", "/"};
    static const char *quirk[] = {"\"", ","}; /* ('\",', '\"') and ('\"', ',\"') share a rank */
    static const char *cjk[] = {"\xe4\xb8\xad", "\xe6\x96\x87", "\xe5\xad\x97", "\xe3\x81\x82", "\xe3\x81\x84"};
    static const char *mixed[] = {"the", " cat", " sat", ",", "\"", " ", "  ", "\n", "1999", "ab", "zzz", "."};
    struct { const char *name; const char *const *a; int k; } kinds[] = {
        {"letters", letters, 15}, {"digits", digits, 10}, {"punctuation", punct, 16},
        {"quirk pairs", quirk, 2}, {"CJK", cjk, 5}, {"mixed text", mixed, 12}};
    size_t sizes[] = {255, 256, 300, 1000, 5000, 20000};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++)
        for (size_t j = 0; j < sizeof sizes / sizeof *sizes; j++)
            for (int rep = 0; rep < 3; rep++) {
                size_t n, count;
                char *s = random_text(kinds[i].a, kinds[i].k, sizes[j], &n);
                CHECK(same_ids(tok, s, n, &count), "%s, %zu bytes (rep %d): heap and quadratic loop differ",
                      kinds[i].name, n, rep);
                free(s);
            }
    /* one letter repeated: every step merges many occurrences of one pair, (a, a) included */
    char *aa = malloc(5001);
    memset(aa, 'a', 5000);
    size_t count;
    CHECK(same_ids(tok, aa, 5000, &count) && count == 1250, "5000 x 'a': %zu tokens", count);
    free(aa);
}

TEST_CASE(two_megabytes_without_a_space) {
    static const char *letters[] = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m",
                                    "n", "o", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z"};
    size_t n;
    char *s = random_text(letters, 26, (size_t)2 << 20, &n);
    double t0 = nb_now();
    int32_t *ids;
    size_t k = nb_tokenizer_encode(tok, s, n, &ids);
    double dt = nb_now() - t0;
    printf("  2 MB of letters without a space: %zu tokens in %.2f s\n", k, dt);
    CHECK(dt < 20, "took %.1f s (the quadratic loop: ~5 minutes)", dt);
    size_t m;
    char *back = nb_tokenizer_decode(tok, ids, k, &m);
    CHECK(m == n && !memcmp(back, s, n), "decode(encode(x)) != x");
    /* a 20 KB word cut from it: the same ids as the quadratic loop (2 MB would take minutes) */
    size_t cnt;
    CHECK(same_ids(tok, s, 20000, &cnt), "20 KB prefix as a word: heap and quadratic loop differ");
    free(back), free(ids), free(s);
}

int main(void) {
    const char *dir = getenv("NB_TOKENIZER_DIR") ? getenv("NB_TOKENIZER_DIR") : "data/gpt2";
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    if (stat(path, &st) != 0) {
        printf("no GPT-2 tokenizer files in %s (scripts/fetch_data.sh tokenizer)\n", dir);
        return 77;
    }
    tok = nb_tokenizer_load(dir);
    RUN(long_words_match_the_quadratic_loop);
    RUN(two_megabytes_without_a_space);
    nb_tokenizer_free((nb_tokenizer *)tok);
    TEST_EXIT();
}
