/*
 * fk_assert.h: FK_ASSERT, an assertion that stays on when NDEBUG is
 * defined (a distribution's release build turns assert() off).
 *
 * For the checks whose failure would corrupt data or answer a client
 * wrongly (a protocol core applying an entry it must not, a state machine
 * installing a stream out of order): such a replica must stop, loudly,
 * rather than go on and spread the damage (STYLE.md point 10; Redis'
 * serverAssert, TigerBeetle's assert). Plain assert() stays for checks of
 * the code's own bookkeeping where going on loses nothing.
 *
 * On failure: one error line through fk_log ("assertion failed: EXPR
 * (file:line, function)"), then abort(), so a core dump or the sanitizer's
 * report shows the stack.
 *
 * Thread safety: any thread.
 */
#ifndef FK_ASSERT_H
#define FK_ASSERT_H

#define FK_ASSERT(cond) ((cond) ? (void)0 : fk__assert_fail(#cond, __FILE__, __LINE__, __func__))

_Noreturn void fk__assert_fail(const char *expr, const char *file, int line, const char *func);

#endif /* FK_ASSERT_H */
