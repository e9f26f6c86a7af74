/* test_report.c — text that fits the terminal (report.c mp_report_fit_text): the
 * expected outputs below are worked by hand from the rule (wrap at the last space
 * within the width, continuation lines indented where the line's value starts,
 * trailing blanks removed, a word longer than the line cut between characters).
 * And suggest's report without a target. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model.h"
#include "report/report.h"

/* mp_report_fit_text(text, width) into a string the caller frees. */
static char *fit(const char *text, size_t width)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    mp_report_fit_text(f, text, strlen(text), width);
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void expect(const char *text, size_t width, const char *want)
{
    char *got = fit(text, width);
    assert_string_equal(got, want);
    free(got);
}

static void test_short_lines_lose_trailing_blanks_only(void **state)
{
    (void)state;
    expect("abc  \t\nxyz\n\n  indented \n", 10, "abc\nxyz\n\n  indented\n");
    expect("no newline at the end   ", 100, "no newline at the end");
}

/* "label     one two three four five" (33 bytes) in 20 columns: the value starts at
 * column 10, so the continuations are indented by 10. */
static void test_long_line_wraps_under_its_value(void **state)
{
    (void)state;
    expect("label     one two three four five\n", 20, "label     one two\n          three four\n          five\n");
    /* exactly the width: unchanged */
    expect("label     one two\n", 17, "label     one two\n");
}

/* no run of two blanks: continuations are indented two past the line's own indent */
static void test_hang_without_a_value_column(void **state)
{
    (void)state;
    expect("  a bb ccc dddd\n", 9, "  a bb\n    ccc\n    dddd\n");
}

static void test_word_longer_than_the_line_is_cut(void **state)
{
    (void)state;
    expect("abcdefghij\n", 4, "abcd\n  ef\n  gh\n  ij\n");
}

/* "ééééé": 10 bytes, each é two (C3 A9); a cut never separates them */
static void test_cut_keeps_utf8_characters_whole(void **state)
{
    (void)state;
    expect("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\n", 5,
           "\xc3\xa9\xc3\xa9\n  \xc3\xa9\n  \xc3\xa9\n  \xc3\xa9\n");
}

/* --wide: no wrapping at all, but still no trailing blanks */
static void test_unlimited_width_only_strips(void **state)
{
    (void)state;
    char line[400];
    memset(line, 'x', 300);
    strcpy(line + 300, " y   \n");
    char want[400];
    memset(want, 'x', 300);
    strcpy(want + 300, " y\n");
    expect(line, SIZE_MAX, want);
}

/* Any text: every line within the width, none ending in a blank, and the words
 * (maximal runs of non-blanks) the same and in the same order. */
static void test_any_text_fits_and_keeps_its_words(void **state)
{
    (void)state;
    char text[4096];
    size_t n = 0;
    unsigned r = 12345;
    while (n < sizeof text - 64) {
        r = r * 1103515245u + 12345u;
        unsigned k = (r >> 16) % 23;
        if (k == 0)
            text[n++] = '\n';
        else if (k < 5)
            text[n++] = ' ';
        else
            for (unsigned i = 0; i < 1 + (r >> 8) % 14; i++)
                text[n++] = (char)('a' + i % 26);
    }
    text[n] = '\0';
    for (size_t width = 12; width <= 100; width += 11) {
        char *got = fit(text, width);
        size_t col = 0;
        for (const char *c = got; *c; c++) {
            if (*c == '\n') {
                assert_true(c == got || c[-1] != ' ');
                col = 0;
            } else {
                col++;
                assert_true(col <= width);
            }
        }
        const char *a = text, *b = got;
        for (;;) {
            while (*a == ' ' || *a == '\n')
                a++;
            while (*b == ' ' || *b == '\n')
                b++;
            if (!*a || !*b)
                break;
            /* a word of the input may be cut over lines: compare character by character */
            assert_int_equal(*a, *b);
            a++;
            b++;
        }
        assert_true(!*a && !*b);
        free(got);
    }
}

/* suggest's report without a target profile (main.c leaves a 0-byte target out): the text
 * names "the target", where it read the null profile's name ("(null)" in a release build). */
static void test_suggest_without_a_target(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_model_load_file(&m, "models/tiny-test.json", &d), MP_OK);
    struct mp_suggestion *sg = calloc(1, sizeof *sg);
    assert_non_null(sg);
    sg->best = -1;
    snprintf(sg->note, sizeof sg->note, "nothing fits");
    struct mp_report_ctx c;
    memset(&c, 0, sizeof c);
    c.command = "suggest";
    c.model = &m;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    mp_report_suggest(f, &c, sg, MP_EMIT_NONE);
    assert_int_equal(fclose(f), 0);
    assert_non_null(strstr(buf, "memplan: tiny-test does not fit the target: nothing fits\n"));
    assert_null(strstr(buf, "(null)"));
    free(buf);
    free(sg);
    mp_model_release(&m);
}

/* mp_text_clean (util.c): how a text report shows a name from an input file.  The escapes
 * below are written out by hand. */
static void test_names_shown_with_controls_escaped(void **state)
{
    (void)state;
    char buf[256];
    /* printable ASCII and UTF-8 (e-acute, a check mark, a no-break space) as they are */
    assert_string_equal(mp_text_clean("h.0.attn \xC3\xA9\xE2\x9C\x93\xC2\xA0", buf, sizeof buf),
                        "h.0.attn \xC3\xA9\xE2\x9C\x93\xC2\xA0");
    /* ESC, BEL, newline, tab, DEL: the terminal's title, a cleared screen, a split row */
    assert_string_equal(mp_text_clean("a\x1b]0;t\x07\x1b[2J\nb\tc\x7f", buf, sizeof buf),
                        "a\\x1b]0;t\\x07\\x1b[2J\\x0ab\\x09c\\x7f");
    /* C1 controls (U+009B is CSI to some terminals) and bytes that are not UTF-8 */
    assert_string_equal(mp_text_clean("x\xC2\x9By\xC2\x85", buf, sizeof buf), "x\\u009by\\u0085");
    assert_string_equal(mp_text_clean("\xFF\xC3(\xE2\x9C", buf, sizeof buf), "\\xff\\xc3(\\xe2\\x9c");
    /* a small buffer: cut before an escape or a character that does not fit, never inside */
    assert_string_equal(mp_text_clean("ab\x1b", buf, 6), "ab");
    assert_string_equal(mp_text_clean("ab\x1b", buf, 7), "ab\\x1b");
    assert_string_equal(mp_text_clean("a\xC3\xA9", buf, 3), "a");
    assert_string_equal(mp_text_clean("", buf, 1), "");
    /* 4 bytes out for each byte in, at most: 4 x strlen + 1 holds any name */
    char worst[64];
    memset(worst, 0x1b, sizeof worst - 1);
    worst[sizeof worst - 1] = 0;
    assert_int_equal(strlen(mp_text_clean(worst, buf, 4 * (sizeof worst - 1) + 1)), 4 * (sizeof worst - 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_short_lines_lose_trailing_blanks_only),
        cmocka_unit_test(test_long_line_wraps_under_its_value),
        cmocka_unit_test(test_hang_without_a_value_column),
        cmocka_unit_test(test_word_longer_than_the_line_is_cut),
        cmocka_unit_test(test_cut_keeps_utf8_characters_whole),
        cmocka_unit_test(test_unlimited_width_only_strips),
        cmocka_unit_test(test_any_text_fits_and_keeps_its_words),
        cmocka_unit_test(test_suggest_without_a_target),
        cmocka_unit_test(test_names_shown_with_controls_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
