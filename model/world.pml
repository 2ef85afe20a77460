/* The world around one run: the network and the receiver, leases running out, a Temporal reset,
 * operators, the reconciler; the compensation workflow an operator starts; and what must hold
 * when nothing can move any more.
 */

/* -- the receiver (examples/billing honouring no key or the key; onceflow.receiver's kit) ---- */
/* A request arrives: applied (an effect, counted by the receiver itself), deduplicated, refused by
 * the kit's fence, or rejected (a definite no, no effect). Its reply may be lost on the way back. */
/* The world's scratch: e_j, e_s only inside d_steps; k, t, r, c are Env's own, zeroed after use. */
hidden byte e_j;
hidden mtype e_s;

#define DELIVER(i) atomic { wt[i] != 0 -> \
    k = wk[i]; t = wt[i]; wt[i] = 0; wirek[k]--; \
    if \
    :: RECEIVER == R_KIT && fenced[k] -> r = 2      /* absent became never */ \
    :: RECEIVER != R_NOKEY && seen[k] -> r = 1      /* the key's first answer, again */ \
    :: else -> \
        if \
        :: REJECTS -> r = 2 \
        :: r = 1; c = 1 \
        fi \
    fi; \
    d_step { printf("@@ arrive k=%d t=%d applied=%d\n", k, t, c); if :: c -> applied(k, t) :: else -> skip fi }; \
    if \
    :: !adead[t] -> rep[t] = r \
    :: skip     /* the reply is lost (or nobody waits for it) */ \
    fi; \
    k = 0; t = 0; r = 0; c = 0 }

/* An effect at the receiver, and what must hold when one lands. */
inline applied(k, t) {
    eff[k]++; seen[k] = 1;
    /* property: no key takes effect twice (a receiver honouring no key counts every arrival) */
    assert(RECEIVER != R_NOKEY || eff[k] <= 1);
    /* property: an effect lands only while its own reservation is open: nobody decided the call
       (failed, or gave it to another attempt) while its request was still on the wire */
    assert((own[k] == t && (st[k] == STARTED || st[k] == INDET)) || mistaken[k]);
    /* property: the model was not told it did not take effect */
    assert(!toldfail[k] || mistaken[k]);
    /* property: no intent paid twice, unless one was made after the model heard the other's
       outcome, as it still stood (or the ledger held the other not applied) */
    e_j = 0;
    do
    :: e_j < NK ->
        assert(INTENT == I_ALLOW || e_j == k || pay[e_j] != pay[k] || eff[e_j] == 0
               || (lic[k] & (1 << e_j)) || (lic[e_j] & (1 << k)));
        e_j++
    :: else -> break
    od
}

#define LOSE(i) d_step { wt[i] != 0 -> wirek[wk[i]]--; printf("@@ lost k=%d\n", wk[i]); wt[i] = 0; wk[i] = 0 }

/* -- operators: settle (from the receiver's records), acknowledge a conflict, approve, deny,
 *    release, ask for a compensation, settle a compensation ------------------------------------ */
/* Operators settle an unknown call (indeterminate, or started with its lease run out) from what
 * they checked at the receiver. Nothing holds them back inside the owner's lease (ledger/decisions.py:
 * an operator decides on what they checked), so a "failed" decided while the owner's request could
 * still land is the operator's own mistake if it does. */
#define SETTLEABLE(x) (st[x] == INDET || (st[x] == STARTED && LEASE_OVER(x)))
#define UNPROVEN(x) (eff[x] == 0 && (wirek[x] > 0 || sending[x]))
#define OP_SETTLE(x) d_step { ops < OPS && SETTLEABLE(x) -> ops++; \
    if :: st[x] == STARTED -> expire(x) :: else -> skip fi; \
    mistaken[x] = mistaken[x] | UNPROVEN(x); \
    printf("@@ settle k=%d by=operator completed=%d", x, eff[x] > 0); settle(x, eff[x] > 0, BY_OPERATOR); \
    printf(" -> %e", out); row(x) }
#define OP_MISTAKE(x) d_step { ops < OPS && mistakes < MISTAKES && SETTLEABLE(x) -> ops++; mistakes++; \
    if :: st[x] == STARTED -> expire(x) :: else -> skip fi; \
    mistaken[x] = 1; printf("@@ settle k=%d by=operator completed=%d", x, eff[x] == 0); \
    settle(x, eff[x] == 0, BY_OPERATOR); printf(" -> %e", out); row(x) }
#define OP_ACK(x) d_step { ops < OPS && cf[x] -> ops++; \
    if :: eff[x] > 0 && undone[x] > 0 -> e_s = COMPENSATED :: eff[x] > 0 && undone[x] == 0 -> e_s = COMPLETED \
       :: else -> e_s = FAILED fi; \
    printf("@@ acknowledge k=%d status=%e", x, e_s); acknowledge(x, e_s); printf(" -> %e", O_OK); row(x) }
#define OP_APPROVE(x) d_step { APPROVAL && ops < OPS && st[x] == AWAIT && !ap[x] -> ops++; ap[x] = 1; \
    printf("@@ approve k=%d -> %e", x, O_OK); row(x) }
#define OP_DENY(x) d_step { APPROVAL && ops < OPS && st[x] == AWAIT && !ap[x] -> ops++; \
    settle_row(x, DENIED, KDENIED, BY_OPERATOR); printf("@@ deny k=%d by=operator -> %e", x, O_OK); row(x) }
#define OP_RELEASE(x) d_step { ops < OPS && (st[x] == HELD || (st[x] == AWAIT && ap[x])) -> ops++; \
    hb[x] = NOKEY; settle_row(x, FAILED, RELEASED, BY_OPERATOR); printf("@@ release k=%d -> %e", x, O_OK); row(x) }
#define OP_COMPENSATE(x) atomic { COMPENSATE && ops < OPS && st[x] == COMPLETED && rf[x] == NOKEY && !asked[x] \
    -> ops++; asked[x] = 1; printf("@@ compensate k=%d -> %e", x, O_OK); row(x); run Comp(x) }
#define OP_COMP_SETTLE(x) atomic { ops < OPS && cks[x] == INDET -> ops++; \
    if :: undone[x] > 0 -> cks[x] = COMPLETED :: else -> cks[x] = FAILED fi; \
    printf("@@ comp_settle k=%d status=%e\n", x, cks[x]); \
    if :: nudge[x] = 1 :: skip fi }

/* -- the reconciler: the tool's hook looks the key up at the receiver (the kit fences an absent
 *    key first), then settles; if someone settled first, its answer is a late outcome. A plain
 *    hook's "not there" is proof only once the owner's request can no longer land: inside the lease
 *    the ledger refuses it (OwnerLeaseLiveError, the round leaves the call as it is); "found" and a
 *    fence are proof at once (activities/reconcile.py). Without mistakes the look and the settlement
 *    are one step (honest answers cannot contradict each other, so nothing between them matters). */
#define OLD_RECONCILE (INSPECT_LIVE_LEASE || UNKNOWN_LIVE_LEASE)
#define PROOF(x) (rv[x] == 1 || RECEIVER == R_KIT || OLD_RECONCILE)
#define RECON_GUARD(x) HOOK && recon[x] && rv[x] == 0 && st[x] == INDET
#define RECON_VERDICT(x) \
    if :: RECEIVER == R_KIT && !seen[x] -> fenced[x] = 1 :: else -> skip fi; \
    if :: seen[x] || eff[x] > 0 -> rv[x] = 1 :: else -> rv[x] = 2 fi
#define RECON_SETTLE_NOW(x) \
    if :: !PROOF(x) -> expire(x) :: else -> skip fi; \
    printf("@@ settle k=%d by=reconciler completed=%d", x, rv[x] == 1); settle(x, rv[x] == 1, BY_RECONCILER); \
    if :: out == O_SETTLED -> late_outcome(x, rv[x] == 1) :: else -> mistaken[x] = mistaken[x] | rvm[x] fi; \
    printf(" -> %e", out); row(x); rv[x] = 0; rvm[x] = 0
#define RECON_SETTLE(x) d_step { rv[x] != 0 && (PROOF(x) || LEASE_OVER(x)) -> RECON_SETTLE_NOW(x) }
#define RECON_EARLY(x) d_step { rv[x] == 2 && !PROOF(x) && !LEASE_OVER(x) -> \
    printf("@@ settle k=%d by=reconciler completed=0 -> %e", x, O_EARLY); row(x); rv[x] = 0; rvm[x] = 0 }
#if MISTAKES
#define RECON_LOOK(x) atomic { RECON_GUARD(x) -> RECON_VERDICT(x); \
    if :: mistakes < MISTAKES -> mistakes++; rv[x] = 3 - rv[x]; rvm[x] = 1 :: skip fi; \
    printf("@@ lookup k=%d found=%d\n", x, rv[x] == 1) }
#else
#define RECON_LOOK(x) d_step { RECON_GUARD(x) && (seen[x] || eff[x] > 0 || RECEIVER == R_KIT || OLD_RECONCILE \
    || LEASE_OVER(x)) -> RECON_VERDICT(x); printf("@@ lookup k=%d found=%d\n", x, rv[x] == 1); RECON_SETTLE_NOW(x) }
#endif

bit rvm[NK];

proctype Env() {
    byte k, t, r;
    bit c;
end:
    do
    :: DELIVER(0)
    :: DELIVER(1)
    :: LOSE(0)
    :: LOSE(1)
    :: d_step { resets < RESETS && !resetreq && (rundone || !RESET_AT_END) -> resets++; resetreq = 1 }
    EACH(OP_SETTLE)
    EACH(OP_MISTAKE)
    EACH(OP_ACK)
    EACH(OP_APPROVE)
    EACH(OP_DENY)
    EACH(OP_RELEASE)
    EACH(OP_COMPENSATE)
    EACH(OP_COMP_SETTLE)
    EACH(RECON_LOOK)
    EACH(RECON_SETTLE)
    EACH(RECON_EARLY)
    od
}

/* -- CompensationWorkflow (workflows/compensation.py): once, because an operator asked ------ */
proctype Comp(byte x) {
    if
    :: atomic { !(st[x] == COMPLETED || st[x] == COMPENSATED) -> printf("@@ comp_not_compensable k=%d\n", x) };
        goto done
    :: else -> skip
    fi;
    atomic { cks[x] = STARTED; printf("@@ comp_reserve k=%d\n", x) };
    if
    :: atomic {   /* the undo reaches the receiver */
        /* property: compensation only after an operator asked */
        assert(asked[x]);
        undone[x]++; printf("@@ comp_arrive k=%d\n", x) };
        if
        :: atomic { cks[x] = COMPLETED; printf("@@ comp_outcome k=%d completed=1\n", x) }
        :: atomic { cks[x] = INDET; printf("@@ comp_outcome k=%d completed=unknown\n", x) }
        fi
    :: atomic { cks[x] = INDET; printf("@@ comp_outcome k=%d completed=unknown\n", x) }
    fi;
    do
    :: cks[x] == INDET ->
        compwait[x] = 1;
#if COMP_NUDGE_ONLY
end_nudge:
        atomic { nudge[x] -> nudge[x] = 0; compwait[x] = 0 }
#else
end_settled:
        atomic { IS_SETTLED(cks[x]) -> compwait[x] = 0 }
#endif
    :: else -> break
    od;
    atomic {
        printf("@@ mark_compensated k=%d", x);
        if
        :: cks[x] == COMPLETED && st[x] == COMPLETED -> st[x] = COMPENSATED; out = O_OK
        :: else -> out = O_IGNORED
        fi;
        printf(" -> %e", out); row(x)
    };
done:
    skip
}

/* -- when nothing can move: every call is settled or in a state an operator acts on ---------- */
proctype Checker() {
    byte k;
    timeout ->
    d_step {
        k = 0;
        do
        :: k < NK ->
            /* settled, or visible to operators: unknown, held, awaiting approval, or started with
               its owner's lease run out (no started call past its lease is left to nobody) */
            assert(st[k] == NONE || IS_SETTLED(st[k]) || st[k] == INDET || st[k] == HELD || st[k] == AWAIT
                   || (st[k] == STARTED && LEASE_OVER(k)));
            /* the ledger agrees with the receiver, or shows operators that it may not */
            assert(!(st[k] == COMPLETED && rf[k] == NOKEY) || eff[k] > 0 || mistaken[k]);
            assert(!(st[k] == FAILED && eff[k] > 0) || cf[k] || mistaken[k]);
            /* a compensation whose call was settled is not left waiting (the original stays
               completed instead of compensated) */
            assert(!(compwait[k] && IS_SETTLED(cks[k])));
            k++
        :: else -> break
        od;
        printf("@@ end\n")
    }
}

init {
    byte x, y;
    atomic {
        x = 0;
        do
        :: x < NK ->
            st[x] = NONE; fk[x] = FK0; rf[x] = NOKEY; hb[x] = NOKEY; told[x] = NONE; ths[x] = NONE;
            cks[x] = NONE; x++
        :: else -> break
        od;
        x = 0;
        do
        :: x <= MAXATT ->
            tokkey[x] = NOKEY; ast[x] = NONE;
            y = 0;
            do
            :: y < NK -> ahd[x].s[y] = NONE; y++
            :: else -> break
            od;
            x++
        :: else -> break
        od;
        run Env(); run Checker(); run Run()
    }
}
