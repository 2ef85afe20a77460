/* The ledger: one run's calls as rows, and every transition the SQL makes, each one atomic.
 *
 * Rows are the model's shared state. Each inline below is one statement or one locked transaction
 * of the real ledger, named after it, and prints one line that tests/support/protocol_trace.py
 * replays against the real PostgreSQL ledger (tests/test_protocol_model.py):
 *
 *     @@ <op> k=<key> ... | st=<status> fk=<failure kind> own=<token> rf=<reused from> hb=<held by> cf=<open conflict>
 *
 * Mirrors (read these beside it): ledger/migrations/0017_held_twins_hold_nothing.sql
 * (onceflow_guarded_decide: the reservation's decision), ledger/queries/calls.py (COMPLETE_STARTED,
 * FAIL_STARTED, SET_INDETERMINATE), ledger/calls.py (the owner's late outcome), ledger/decisions.py
 * (settle, record_late_outcome, mark_compensated), ledger/conflicts.py (FLAG_CONFLICT,
 * ACKNOWLEDGE_CONFLICT), ledger/approvals.py (approve, deny, release).
 */

mtype = { NONE, HELD, AWAIT, STARTED, INDET, COMPLETED, FAILED, DENIED, COMPENSATED };
mtype = { FK0, NOT_ATTEMPTED, REJECTED, NOT_APPLIED, KDENIED, POLICY, GUARD, RELEASED };
/* What a reservation answers (onceflow.ledger.Reservation), and DEADLINE: refused, the attempt's
 * activity deadline has passed (nothing written). */
mtype = { O_NEW, O_RETRY, O_AWAIT, O_COMPLETED, O_INFLIGHT, O_SETTLED, O_HELD, O_REUSED, O_REFUSED,
          O_DEADLINE, O_IGNORED, O_OK, O_EARLY };

#define NOKEY 255
/* settled_by, besides an owner's token (1..MAXATT): */
#define BY_GUARD 200
#define BY_OPERATOR 201
#define BY_RECONCILER 202
#define BY_DEADLINE 203

/* -- the rows ------------------------------------------------------------------------------ */
mtype st[NK];        /* status; NONE: no row */
mtype fk[NK];        /* failure_kind */
byte own[NK];        /* owner: the token of the attempt that reserved or dispatched it (0: none) */
bit leased[NK];      /* lease_expires_at is in the future (started, indeterminate) */
bit cf[NK];          /* a conflict is open: conflict_at set, not cleared */
bit cfever[NK];      /* conflict_at set, open or acknowledged: the key is never reserved again */
byte rf[NK];         /* reused_from */
byte hb[NK];         /* held_by */
byte ver[NK];        /* how many times settled_at was set: what "that outcome's settlement" compares */
byte sby[NK];        /* settled_by */
bit ap[NK];          /* approved_at is set */
byte seq[NK];        /* created_at, as an order: 0 for no row */
byte nseq;
byte pay[NK];        /* the canonical payload (twins share one) */
byte tokkey[MAXATT + 1];  /* WAS_OWNER: the key each token reserved (NOKEY: none) */
byte aborn[MAXATT + 1];   /* ver[k] of its call when the attempt began (queries' began_at) */
bit cfrep[NK];       /* the open conflict's report: 1 completed, 0 failed (same_report) */

/* -- the receiver (its own count is the judge of effects, never the ledger) ----------------- */
byte eff[NK];        /* effects the receiver applied under each key */
bit seen[NK];        /* the receiver holds a record of the key (honours keys, kit) */
bit fenced[NK];      /* the kit's fence: absent became never */
byte undone[NK];     /* compensations applied at the receiver */

/* -- ghosts: what the properties need and nothing reads ------------------------------------- */
bit mistaken[NK];    /* a decider (operator or hook) settled it against the receiver's truth */
byte lic[NK];        /* licences: bit j set if, when this call was decided `proceed`, the model
                        knew twin j's outcome as it still stood (see protocol.pml, told[]) */

/* Scratch of the decisions: deterministic code inside one atomic step, so kept out of the state. */
hidden byte d_j, d_m, d_best, d_other, d_heard, a_j, a_m;
hidden byte d_any;
hidden mtype d_act, out;

#define IS_SETTLED(s) ((s) == COMPLETED || (s) == FAILED || (s) == DENIED || (s) == COMPENSATED)
#define UNRESOLVED_SENT(s) ((s) == AWAIT || (s) == STARTED || (s) == INDET)
#define HOLDS(j) (UNRESOLVED_SENT(st[j]) || (st[j] == FAILED && cf[j]))
#define FINAL_KIND(f) ((f) == POLICY || (f) == GUARD || (f) == RELEASED)
#define TWIN(j, k) ((j) != (k) && seq[j] != 0 && pay[j] == pay[k])
/* What a row draws on its budget (onceflow_budget_draws, migration 0019); every amount is 1. */
#define DRAWS(j) (seq[j] != 0 && rf[j] == NOKEY && (UNRESOLVED_SENT(st[j]) || st[j] == COMPLETED \
                  || (st[j] == FAILED && cf[j])))

/* A lease runs out only once no request of it is on the wire and its owner is not about to send
 * (the lease is the tool's timeout plus a margin: the model's one assumption about time). It
 * changes nothing in the ledger by itself, so it is taken at the step that relies on it:
 * LEASE_OVER says it may have run out by now, expire() records that it did (and the trace says so).
 * Time moves for every attempt: a lease taken by attempt t runs out after the deadline of t and of
 * every attempt started before t (the lease is as long as an attempt's time, and it began later). */
#define LEASE_OVER(x) (!leased[x] || (!sending[x] && wirek[x] == 0))
inline expire(x) {
    if
    :: leased[x] && LEASE_OVER(x) ->
        leased[x] = 0; printf("@@ lease_expired k=%d\n", x);
        a_m = 1;
        do
        :: a_m <= own[x] -> if :: !adead[a_m] -> dl[a_m] = 1 :: else -> skip fi; a_m++
        :: else -> break
        od
    :: else -> skip
    fi
}

inline row(k) {
    printf(" | st=%e fk=%e own=%d rf=%d hb=%d cf=%d v=%d\n", st[k], fk[k], own[k], rf[k], hb[k], cf[k], ver[k])
}

inline settle_row(k, status, kind, by) {
    st[k] = status; fk[k] = kind; sby[k] = by; ver[k]++; leased[k] = 0
}

/* -- the guarded reservation (onceflow_guarded_decide, ledger/definitions/guarded_reserve.sql) --
 * Decides for call k, reserved by attempt tok with the heard list ahd[tok] (per call of the run,
 * the status and settlement the model was told; NONE where not heard) and the call's intent. Sets
 * `out` (the reservation's answer), d_act (what was decided; 255: the row answered for itself) and
 * writes the row. Deterministic: run inside one d_step. */
inline heard_now(j, res, tok) {
    /* Does twin j's outcome stand as the model was told it (onceflow_heard_stands)? */
#if HEARD_BY_STATUS_NOW
    /* 0017: its id is in the heard list and it is settled now, not failed with an open conflict. */
    res = (ahd[tok].s[j] != NONE && IS_SETTLED(st[j]) && !(st[j] == FAILED && cf[j]))
#else
    /* settled, no open conflict, the status and settlement told; a reused twin while the call it
       reused still completed */
    res = (ahd[tok].s[j] != NONE && IS_SETTLED(st[j]) && !cf[j] && st[j] == ahd[tok].s[j]
           && ver[j] == ahd[tok].v[j] && (rf[j] == NOKEY || st[rf[j]] == COMPLETED))
#endif
}

inline decide(k, tok, intent) {
    d_any = 0; d_other = NOKEY; d_act = O_NEW; out = O_NEW;
    if
    :: st[k] != NONE && !(st[k] == HELD || (st[k] == FAILED && !cfever[k] && !FINAL_KIND(fk[k])
                                              && (STALE_ATTEMPT_RETRIES || ver[k] == aborn[tok]))) ->
        /* any other row answers for itself; so does a failure settled after the attempt began
           (its workflow gave up on it: an execution a reset replaced) */
        if
        :: st[k] == AWAIT && ap[k] ->
            st[k] = STARTED; own[k] = tok; leased[k] = 1; tokkey[tok] = k; out = O_NEW
        :: else ->
            if
            :: st[k] == COMPLETED && rf[k] == NOKEY -> out = O_COMPLETED
            :: st[k] == COMPLETED && rf[k] != NOKEY -> out = O_REUSED
            :: st[k] == STARTED || st[k] == INDET -> out = O_INFLIGHT
            :: st[k] == AWAIT -> out = O_AWAIT
            :: st[k] == FAILED && fk[k] == GUARD -> out = O_REFUSED
            :: else -> out = O_SETTLED
            fi
        fi;
        d_act = 255   /* nothing decided */
    :: else -> skip
    fi;
    if
    :: d_act == 255 -> skip
    :: else ->
        /* which twins the model heard (bit j of d_heard): heard as they stand, and the call a heard
           reused twin was given (that effect is heard too) */
        d_heard = 0;
        if
        :: intent == I_HOLD ->
            d_j = 0;
            do
            :: d_j < NK ->
                if
                :: TWIN(d_j, k) ->
                    heard_now(d_j, d_any, tok);
                    if
                    :: d_any ->
                        d_heard = d_heard | (1 << d_j);
                        if
                        :: !REUSE_FROM_REUSED && rf[d_j] != NOKEY -> d_heard = d_heard | (1 << rf[d_j])
                        :: else -> skip
                        fi
                    :: else -> skip
                    fi
                :: else -> skip
                fi;
                d_j++
            :: else -> break
            od
        :: else -> skip
        fi;
        if
        :: intent != I_ALLOW ->
            /* (a) hold behind the newest twin not heard that may take effect (a reused row never
               does; a held one was not sent) */
            d_j = 0; d_best = 0;
            do
            :: d_j < NK ->
                if
                :: (TWIN(d_j, k) && !(d_heard & (1 << d_j)) && rf[d_j] == NOKEY
                   && (UNRESOLVED_SENT(st[d_j]) || (st[d_j] == FAILED && cf[d_j])) && seq[d_j] > d_best) ->
                    d_best = seq[d_j]; d_other = d_j
                :: else -> skip
                fi;
                d_j++
            :: else -> break
            od;
            if
            :: d_other != NOKEY -> d_act = O_HELD
            :: else -> skip
            fi;
            /* (b) a twin the receiver refused on policy grounds refuses it */
            d_j = 0;
            do
            :: d_act == O_NEW && d_j < NK ->
                if
                :: TWIN(d_j, k) && st[d_j] == FAILED && fk[d_j] == POLICY -> d_act = O_REFUSED; d_other = d_j
                :: else -> skip
                fi;
                d_j++
            :: else -> break
            od;
            /* (c) reuse */
            if
            :: d_act == O_NEW ->
#if REUSE_NEWEST
                /* 0017: the newest completed twin not heard */
                d_j = 0; d_best = 0;
                do
                :: d_j < NK ->
                    if
                    :: (TWIN(d_j, k) && !(d_heard & (1 << d_j)) && st[d_j] == COMPLETED
                       && (REUSE_FROM_REUSED || rf[d_j] == NOKEY) && seq[d_j] > d_best) ->
                        d_best = seq[d_j]; d_other = d_j
                    :: else -> skip
                    fi;
                    d_j++
                :: else -> break
                od;
#else
                /* the oldest completed twin not heard that no other reused call points to */
                d_j = 0; d_best = 255;
                do
                :: d_j < NK ->
                    if
                    :: (TWIN(d_j, k) && !(d_heard & (1 << d_j)) && st[d_j] == COMPLETED
                       && (REUSE_FROM_REUSED || rf[d_j] == NOKEY) && seq[d_j] < d_best) ->
                        d_m = 0; d_any = 0;
                        do
                        :: d_m < NK -> if :: d_m != k && seq[d_m] != 0 && rf[d_m] == d_j -> d_any = 1 :: else -> skip fi; d_m++
                        :: else -> break
                        od;
                        if :: !d_any -> d_best = seq[d_j]; d_other = d_j :: else -> skip fi
                    :: else -> skip
                    fi;
                    d_j++
                :: else -> break
                od;
#endif
                if :: d_other != NOKEY -> d_act = O_REUSED :: else -> skip fi
            :: else -> skip
            fi;
            /* (d) a compensated twin not heard refuses it */
            d_j = 0;
            do
            :: d_act == O_NEW && d_j < NK ->
                if
                :: (TWIN(d_j, k) && !(d_heard & (1 << d_j)) && st[d_j] == COMPENSATED
                   && (REUSE_FROM_REUSED || rf[d_j] == NOKEY)) -> d_act = O_REFUSED; d_other = d_j
                :: else -> skip
                fi;
                d_j++
            :: else -> break
            od;
#if !REUSE_NEWEST
            /* (e) the oldest completed twin not heard, though another reused call points to it */
            if
            :: d_act == O_NEW ->
                d_j = 0; d_best = 255;
                do
                :: d_j < NK ->
                    if
                    :: (TWIN(d_j, k) && !(d_heard & (1 << d_j)) && st[d_j] == COMPLETED
                       && (REUSE_FROM_REUSED || rf[d_j] == NOKEY) && seq[d_j] < d_best) ->
                        d_best = seq[d_j]; d_other = d_j
                    :: else -> skip
                    fi;
                    d_j++
                :: else -> break
                od;
                if :: d_other != NOKEY -> d_act = O_REUSED :: else -> skip fi
            :: else -> skip
            fi;
#endif
            skip
        :: else -> skip
        fi;
        /* entity: one unresolved call per entity (every call of the model is of one entity) */
        if
        :: d_act == O_NEW && EXCLUSIVE ->
            d_j = 0; d_best = 255;
            do
            :: d_j < NK ->
                if
                :: d_j != k && seq[d_j] != 0 && UNRESOLVED_SENT(st[d_j]) && seq[d_j] < d_best ->
                    d_best = seq[d_j]; d_other = d_j
                :: else -> skip
                fi;
                d_j++
            :: else -> break
            od;
            if :: d_other != NOKEY -> d_act = O_HELD :: else -> skip fi
        :: else -> skip
        fi;
        /* budget: completed plus unresolved (every amount is 1) within LIMIT */
        if
        :: d_act == O_NEW && LIMIT > 0 ->
            d_j = 0; d_m = 0;
            do
            :: d_j < NK -> if :: d_j != k && DRAWS(d_j) -> d_m++ :: else -> skip fi; d_j++
            :: else -> break
            od;
            if :: d_m + 1 > LIMIT -> d_act = O_REFUSED; d_other = NOKEY :: else -> skip fi
        :: else -> skip
        fi;
        /* the write */
        if
        :: d_act == O_HELD && st[k] == HELD && hb[k] == d_other ->
            out = O_HELD   /* still held behind the same call: nothing written */
        :: else ->
            if :: st[k] == NONE -> nseq++; seq[k] = nseq :: else -> skip fi;
            out = d_act;
            if
            :: st[k] == FAILED && d_act == O_NEW -> out = O_RETRY
            :: else -> skip
            fi;
            cf[k] = 0; cfever[k] = 0; hb[k] = NOKEY; rf[k] = NOKEY; ap[k] = 0; leased[k] = 0; fk[k] = FK0;
            if
            :: d_act == O_HELD -> st[k] = HELD; hb[k] = d_other; own[k] = tok; holds_mark(d_other)
            :: d_act == O_REUSED ->
                rf[k] = d_other; own[k] = tok; settle_row(k, COMPLETED, FK0, BY_GUARD);
#if REUSE_FROM_REUSED
                if :: rf[d_other] != NOKEY -> rf[k] = rf[d_other] :: else -> skip fi;
#endif
                skip
            :: d_act == O_REFUSED -> own[k] = tok; settle_row(k, FAILED, GUARD, BY_GUARD)
            :: d_act == O_NEW && APPROVAL -> st[k] = AWAIT; own[k] = tok; tokkey[tok] = k; out = O_AWAIT; sby[k] = 0
            :: d_act == O_NEW && !APPROVAL ->
                st[k] = STARTED; own[k] = tok; leased[k] = 1; tokkey[tok] = k; sby[k] = 0
            fi
        fi
    fi
}

inline holds_mark(j) { skip }  /* holds_calls: only says whom to nudge; the held run asks on a timer anyway */

/* -- the owner's outcome (ledger/calls.py complete/fail and _late_owner_outcome) ----------- */
#define CONTRADICTS(s, completed) (IS_SETTLED(s) && ((completed) != ((s) == COMPLETED || (s) == COMPENSATED)))

inline owner_outcome(k, tok, completed, kind) {
    if
    :: st[k] == STARTED && own[k] == tok ->
        if
        :: completed -> settle_row(k, COMPLETED, FK0, tok)
        :: else -> settle_row(k, FAILED, kind, tok)
        fi;
        out = O_OK
    :: else ->
        if
        :: sby[k] == tok && ((completed && st[k] == COMPLETED) || (!completed && st[k] == FAILED && fk[k] == kind)) ->
            out = O_OK   /* our own write, repeated */
        :: own[k] == tok && st[k] == INDET ->
            if
            :: completed -> settle_row(k, COMPLETED, FK0, tok)
            :: else -> settle_row(k, FAILED, kind, tok)
            fi;
            out = O_OK   /* late, but the truth: it settles the call */
        :: else ->
            if
            :: rf[k] == NOKEY && (own[k] == tok || tokkey[tok] == k) && CONTRADICTS(st[k], completed) ->
                if
                :: cf[k] && cfrep[k] == completed -> skip   /* the same report: nothing new */
                :: else -> cf[k] = 1; cfever[k] = 1; cfrep[k] = completed
                fi
            :: else -> skip
            fi;
            out = O_IGNORED
        fi
    fi
}

/* started -> indeterminate (SET_INDETERMINATE); anything else is left as it is */
inline mark_indeterminate(k) {
    if
    :: st[k] == STARTED -> st[k] = INDET
    :: else -> skip
    fi
}

/* -- decisions by people and reconcilers --------------------------------------------------- */
/* settle (ledger/decisions.py): indeterminate, or started with its owner's lease run out. Sets
 * out = O_OK, or O_SETTLED when it lost (AlreadySettledError / not unknown). */
inline settle(k, completed, by) {
    if
    :: st[k] == INDET || (st[k] == STARTED && !leased[k]) ->
        if
        :: completed -> settle_row(k, COMPLETED, FK0, by)
        :: else -> settle_row(k, FAILED, NOT_APPLIED, by)
        fi;
        out = O_OK
    :: else -> out = O_SETTLED
    fi
}

/* record_late_outcome: the reconciler lost the race; a contradicting report flags a conflict */
inline late_outcome(k, completed) {
    if
    :: rf[k] == NOKEY && CONTRADICTS(st[k], completed) && !(cf[k] && cfrep[k] == completed) ->
        cf[k] = 1; cfever[k] = 1; cfrep[k] = completed
    :: else -> skip
    fi
}

/* ACKNOWLEDGE_CONFLICT: the operator says what the world is; the same status only closes it */
inline acknowledge(k, status) {
    cf[k] = 0;
    if
    :: st[k] != status ->
        if
        :: status == FAILED && fk[k] == FK0 -> fk[k] = NOT_APPLIED
        :: status != FAILED -> fk[k] = FK0
        :: else -> skip
        fi;
        st[k] = status; sby[k] = BY_OPERATOR; ver[k]++
    :: else -> skip
    fi
}
