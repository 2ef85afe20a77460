/* The protocol around the ledger: the run (AgentRunWorkflow and its model), the write activity's
 * attempts, the world (network, receiver, leases, a reset, operators, the reconciler), the
 * compensation workflow, and the checks at the end.
 *
 * Mirrors: workflows/write_calls.py, write_sends.py, write_waits.py, agent_run.py (the run),
 * activities/tools.py run_write_tool and activities/sending.py (an attempt), activities/ledger_steps.py
 * inspect_call (inspection), workflows/reconcile.py and activities/reconcile.py (the reconciler),
 * workflows/compensation.py and activities/compensation.py (compensation).
 */

/* Every key, as options of an if or do: EACH(M) expands to `:: M(0) :: M(1) ...`. */
#if NK == 1
#define EACH(M) :: M(0)
#elif NK == 2
#define EACH(M) :: M(0) :: M(1)
#elif NK == 3
#define EACH(M) :: M(0) :: M(1) :: M(2)
#else
#define EACH(M) :: M(0) :: M(1) :: M(2) :: M(3)
#endif

/* What the model was told about each call it heard, as the run passes it with a call (the
 * activity's input): status and settlement (NONE: not heard), and the effect a completed answer
 * stood for (the call itself, or the call it was reused from). One per attempt: its input. */
typedef Heard { mtype s[NK]; byte v[NK]; byte src[NK] };
Heard ahd[MAXATT + 1];

/* -- the attempts (write activity executions; the token is the attempt's number) ----------- */
byte natt;                /* attempts started */
#define A_NONE 0
#define A_ANSWER 1        /* the ledger's answer (outcome_from_record) */
#define A_UNAVAILABLE 2   /* ERR_LEDGER_UNAVAILABLE: nothing was sent */
byte ares[MAXATT + 1];    /* what the attempt returned to the workflow */
mtype ast[MAXATT + 1];    /* the answer's status */
byte aver[MAXATT + 1];    /* its settlement */
byte asrc[MAXATT + 1];    /* the effect a completed answer stands for */
bit aok[MAXATT + 1];      /* the answer was true when the ledger gave it (see answer()) */
bit apair[MAXATT + 1];    /* a reuse decision paired one to one (see pairing()) */
bit dl[MAXATT + 1];       /* the activity's deadline passed: the workflow stopped waiting */
byte rep[MAXATT + 1];     /* the receiver's reply to the attempt: 0 none, 1 ok, 2 rejected */
byte sending[NK];         /* the token of a live attempt that reserved and has not sent yet */
bit adead[MAXATT + 1];    /* the attempt is over without an answer (crashed, refused, lost reply) */
byte crashes;
byte lostreplies;
byte slows;               /* activity deadlines that passed while the attempt was alive */
byte timeouts;            /* tool timeouts while the request was still on the wire */

/* -- the network: requests on the wire (key, token) ---------------------------------------- */
#define W 2
byte wk[W];
byte wt[W];               /* 0: slot free */
byte wirek[NK];           /* requests of each key on the wire */

/* -- the run and its model ----------------------------------------------------------------- */
mtype told[NK];           /* this conversation: what the model was told of each call (settled) */
byte toldv[NK];
byte tsrc[NK];
bit toldfail[NK];         /* told it did not take effect */
byte convsrc;             /* effects the model was told of in this conversation (bitmask) */
byte inconv;              /* calls made in this conversation (bitmask) */
mtype ths[NK];            /* this turn's heard list, as the run passes it */
byte thv[NK];
byte thsrc[NK];
byte nk;                  /* keys made (c0, c1, ...) */
bit resetreq;
byte resets;
bit rundone;
bit recon[NK];            /* a ReconcileWorkflow was started for the call */
byte rv[NK];              /* the reconciler's lookup, before it settles: 0 none, 1 found, 2 absent */
byte ops;
byte mistakes;

/* -- compensation -------------------------------------------------------------------------- */
bit asked[NK];            /* an operator asked (compensation_requested) */
mtype cks[NK];            /* the compensation call `<key>:compensation` */
bit nudge[NK];            /* a resolve passed on to the compensation workflow */
bit compwait[NK];         /* the compensation workflow waits for its call to be settled */

/* What the ledger's answer for call k says, and whether it is true now: a completed answer stands
 * for an effect the receiver applied (or a decider made a mistake) that is not undone; a failed one
 * for no effect. Checked by the run when it tells the model (the answer may reach it later, when
 * the world has moved on: only what was true when the ledger answered is the ledger's doing). */
inline answer(k, t) {
    ast[t] = st[k]; aver[t] = ver[k]; asrc[t] = k; aok[t] = 1; apair[t] = 1;
    if
    :: st[k] == COMPLETED ->
        if :: rf[k] != NOKEY -> asrc[t] = rf[k] :: else -> skip fi;
        aok[t] = (st[asrc[t]] == COMPLETED && rf[asrc[t]] == NOKEY && (eff[asrc[t]] > 0 || mistaken[asrc[t]]))
    :: st[k] == FAILED || st[k] == DENIED -> aok[t] = (eff[k] == 0 || mistaken[k])
    :: else -> skip
    fi;
    ares[t] = A_ANSWER
}

/* Reuse pairs one to one: when the guard reuses an effect the model was already told of in this
 * conversation, the model was told of every standing effect of the intent. (A key that answers for
 * itself is not a reuse decision: it repeats what it said before.) */
inline pairing(k, t) {
    if
    :: convsrc & (1 << asrc[t]) ->
        a_j = 0;
        do
        :: a_j < NK ->
            if
            :: (a_j != k && seq[a_j] != 0 && pay[a_j] == pay[k] && st[a_j] == COMPLETED && rf[a_j] == NOKEY
               && !(convsrc & (1 << a_j))) -> apair[t] = 0
            :: else -> skip
            fi;
            a_j++
        :: else -> break
        od
    :: else -> skip
    fi
}

/* A licence for call k, decided `proceed` by attempt t: the twins whose outcome the model knew when
 * it made the call, as it still stands (the effect it was told of, still completed; a failure or
 * denial with the same settlement and no conflict; a compensation), and the twins the ledger then
 * held not applied. Judged from what the run told the model (its own record, ahd[t]), not from the
 * guard's view. */
inline licence(k, t) {
    lic[k] = 0; a_j = 0;
    do
    :: a_j < NK ->
        a_m = 0;
        do
        :: a_m < NK ->
            if
            :: ahd[t].s[a_m] == COMPLETED && ahd[t].src[a_m] == a_j && st[a_j] == COMPLETED ->
                lic[k] = lic[k] | (1 << a_j)
            :: else -> skip
            fi;
            a_m++
        :: else -> break
        od;
        if
        :: ((ahd[t].s[a_j] == FAILED || ahd[t].s[a_j] == DENIED) && st[a_j] == ahd[t].s[a_j]
           && ver[a_j] == ahd[t].v[a_j] && !cf[a_j]) -> lic[k] = lic[k] | (1 << a_j)
        :: ahd[t].s[a_j] == COMPENSATED && st[a_j] == COMPENSATED -> lic[k] = lic[k] | (1 << a_j)
        :: else -> skip
        fi;
        /* or the ledger knew the twin had not taken effect (failed or denied, no open conflict): a
           decider's mistake about it is the decider's, not the protocol's */
        if
        :: (st[a_j] == FAILED || st[a_j] == DENIED) && !cf[a_j] -> lic[k] = lic[k] | (1 << a_j)
        :: else -> skip
        fi;
        a_j++
    :: else -> break
    od
}

inline print_heard(t) {
    a_j = 0;
    do
    :: a_j < NK ->
        if
        :: ahd[t].s[a_j] != NONE -> printf(" h%d=%e/%d", a_j, ahd[t].s[a_j], ahd[t].v[a_j])
        :: else -> skip
        fi;
        a_j++
    :: else -> break
    od
}

/* -- one attempt of the write activity (activities/tools.py run_write_tool) ---------------- */
/* A worker dies: the attempt takes no further step (its request, if sent, is still on the wire). */
#define CRASH d_step { crashes < CRASHES -> crashes++; printf("@@ crash t=%d\n", t); \
    if :: sending[k] == t -> sending[k] = 0 :: else -> skip fi }; goto dead

/* Each step below is one transition; where a worker can die, CRASH is the other option of it. */
inline reserve_step() {
    d_step {
        if
        :: !STALE_OWNER_RESERVES && dl[t] ->
            /* past its activity's deadline: the reservation refuses (nothing written) */
            printf("@@ reserve k=%d t=%d late=1", k, t); print_heard(t); printf(" -> %e", O_DEADLINE); row(k);
            res = 3
        :: else ->
            decide(k, t, INTENT);
            printf("@@ reserve k=%d t=%d late=%d", k, t, dl[t]); print_heard(t); printf(" -> %e", out); row(k);
            if
            :: d_act == O_NEW -> licence(k, t)
            :: else -> skip
            fi;
            if
            :: out == O_NEW || out == O_RETRY -> res = 1
            :: else -> answer(k, t); res = 2;
                if :: d_act == O_REUSED -> pairing(k, t) :: else -> skip fi;
                /* a reused call asked again after the call it was given was undone: the model is
                   told that it was compensated (activities/tools.py _answered) */
                if
                :: !REUSE_FROM_REUSED && out == O_REUSED && st[rf[k]] == COMPENSATED ->
                    ast[t] = COMPENSATED; aok[t] = 1
                :: else -> skip
                fi
            fi
        fi
    }
}

/* The owner writes down how its send ended (record_outcome): the ledger's answer is the answer. */
inline record_step() {
    d_step {
        if
        :: kind == FK0 && !completed ->
            printf("@@ indeterminate k=%d by=%d", k, t); mark_indeterminate(k); out = O_OK
        :: else ->
            printf("@@ outcome k=%d t=%d completed=%d kind=%e", k, t, completed, kind);
            owner_outcome(k, t, completed, kind)
        fi;
        printf(" -> %e", out); row(k);
        answer(k, t)
    }
}

proctype Attempt(byte k; byte t; byte lost) {
    bit completed;
    mtype kind;
    byte res;   /* the reservation's verdict for this attempt: 1 send, 2 answered, 3 refused */
#if !LOST_REPLY_UNKNOWN
    /* The retry of an attempt whose reservation answer was lost knows that attempt's token (it
       travels in the error, ToolCallInput.unsent_owners): its reservation, still started under that
       token, was never sent, so it is released as not attempted (the owner's FAIL_STARTED), and the
       call is reserved again (Ledger.reserve with unsent_owners). */
    if
    :: lost != 0 ->
        if
        :: CRASH
        :: d_step {
            if
            :: !STALE_OWNER_RESERVES && dl[t] -> skip   /* past its deadline: the reserve below refuses */
            :: else ->
                if
                :: st[k] == STARTED && own[k] == lost ->
                    printf("@@ release_unsent k=%d t=%d lost=%d", k, t, lost);
                    owner_outcome(k, lost, 0, NOT_ATTEMPTED); printf(" -> %e", out); row(k);
                    aborn[t] = ver[k]   /* its own release: its retry is its own to make */
                :: else -> skip
                fi
            fi
           }
        fi
    :: else -> skip
    fi;
#endif
    if
    :: CRASH
    :: atomic {
        reserve_step();
        if
        :: res != 1 -> goto dead
        :: res == 1 && st[k] == STARTED && lostreplies < LOSTREPLIES ->
            /* it committed; the answer was lost with the connection: "not sent" */
            lostreplies++; printf("@@ lost_reply t=%d\n", t); ares[t] = A_UNAVAILABLE; goto dead
        :: res == 1 -> sending[k] = t; res = 0
        fi
       }
    fi;
    /* between the reservation and the send */
    if
    :: CRASH
    :: atomic {
        sending[k] = 0;
        if
        :: NOTATTEMPTED ->
            /* the tool gives up before anything leaves */
            printf("@@ not_attempted k=%d t=%d\n", k, t); completed = 0; kind = NOT_ATTEMPTED; record_step();
            goto dead
        :: wt[0] == 0 -> wk[0] = k; wt[0] = t; wirek[k]++
        :: wt[0] != 0 && wt[1] == 0 -> wk[1] = k; wt[1] = t; wirek[k]++
        fi;
        printf("@@ send k=%d t=%d\n", k, t)
       }
    fi;
    /* the answer, or the tool's own timeout (unknown), and the owner writes it down */
    if
    :: CRASH
    :: atomic { rep[t] == 1 -> completed = 1; record_step() }
    :: atomic { rep[t] == 2 -> completed = 0; kind = REJECTED; record_step() }
    :: atomic { rep[t] == 0 && (timeouts < TIMEOUTS || !(wt[0] == t || wt[1] == t)) ->
        if :: wt[0] == t || wt[1] == t -> timeouts++ :: else -> skip fi; kind = FK0; record_step() }
    fi;
dead:
    skip;
    /* a finished attempt stays in the state vector: it keeps nothing that tells two runs apart */
    d_step {
        adead[t] = 1; dl[t] = 0; rep[t] = 0; tokkey[t] = NOKEY; aborn[t] = 0;
        a_j = 0;
        do
        :: a_j < NK -> ahd[t].s[a_j] = NONE; ahd[t].v[a_j] = 0; ahd[t].src[a_j] = 0; a_j++
        :: else -> break
        od;
        k = 0; t = 0; lost = 0; completed = 0; kind = 0; res = 0
    }
}

/* -- the run ------------------------------------------------------------------------------- */
hidden byte i;   /* scratch of the run's atomic steps */
byte gen;        /* the run's execution: a reset starts another, and the old one's calls stop */
byte running;    /* calls of this answer not yet told */
bit runfailed;   /* the run failed (on_indeterminate: fail), or gave up */
byte adopted;    /* calls of the run it adopted (made before a reset) */

inline take(t) {
    cst = ast[t]; cver = aver[t]; csrc = asrc[t]; cok = aok[t]; cpair = apair[t];
    ast[t] = NONE; aver[t] = 0; asrc[t] = 0; aok[t] = 0; apair[t] = 0
}

inline read_row(k) {
    cst = st[k]; cver = ver[k]; csrc = k; cok = 1; cpair = 1;
    if
    :: st[k] == COMPLETED && rf[k] != NOKEY -> csrc = rf[k]
    :: else -> skip
    fi;
    if
    :: st[k] == COMPLETED -> cok = (st[csrc] == COMPLETED && rf[csrc] == NOKEY && (eff[csrc] > 0 || mistaken[csrc]))
    :: st[k] == FAILED || st[k] == DENIED -> cok = (eff[k] == 0 || mistaken[k])
    :: else -> skip
    fi
}

/* inspect_call: after a lost attempt, what does the ledger know? (activities/ledger_steps.py) */
inline inspect(k) {
    /* a started call whose owner's lease is live is left alone until it runs out */
    (INSPECT_LIVE_LEASE || st[k] != STARTED || LEASE_OVER(k));
    d_step {
        if :: !INSPECT_LIVE_LEASE && st[k] == STARTED -> expire(k) :: else -> skip fi;
        printf("@@ inspect k=%d", k);
        if
        :: st[k] == STARTED ->
            /* property: a call is unknown only if it may have been sent; a reservation whose
               answer was lost, and which the run knows was never sent, is not */
            assert(own[k] != glost || glost == 0);
            mark_indeterminate(k)
        :: else -> skip
        fi;
        printf(" -> %e", O_OK); row(k);
        read_row(k);
        /* a reused call read back after the call it was given was undone: the model is told that
           it was compensated (activities/outcomes.py as_told), as on the reserve path */
        if
        :: !INSPECT_REUSED_AS_IS && st[k] == COMPLETED && rf[k] != NOKEY && st[rf[k]] == COMPENSATED ->
            cst = COMPENSATED; cok = 1
        :: else -> skip
        fi
    }
}

/* _send_once: run the write activity; if it was lost, ask the ledger */
inline send_once(k) {
    lost = 0; glost = 0;
    do
    :: atomic {
            natt < MAXATT -> natt++; t = natt; aborn[t] = ver[k];
            printf("@@ begin k=%d t=%d\n", k, t);
            i = 0;
            do
            :: i < NK -> ahd[t].s[i] = ths[i]; ahd[t].v[i] = thv[i]; ahd[t].src[i] = thsrc[i]; i++
            :: else -> break
            od;
            run Attempt(k, t, lost)
        };
        if
        :: atomic { ares[t] == A_ANSWER -> take(t) }; break
        :: atomic { ares[t] == A_UNAVAILABLE ->
#if LOST_REPLY_UNKNOWN
            lost = 0;
#else
            lost = t;
#endif
            glost = t }
        :: atomic { ares[t] == A_NONE && (adead[t] || dl[t] || slows < SLOWS) ->
            if :: !adead[t] && !dl[t] -> slows++ :: else -> skip fi;
            dl[t] = 1; printf("@@ deadline t=%d\n", t) };
            /* the activity timed out or its worker died: ask the ledger */
#if !INSPECT_FORGETS_UNSENT
            /* a reservation still started under an attempt whose answer was lost was never sent:
               released as not attempted, and the call is run again (proposed; see the switch) */
            d_step {
                if
                :: lost != 0 && st[k] == STARTED && own[k] == lost ->
                    printf("@@ release_unsent k=%d lost=%d", k, lost);
                    owner_outcome(k, lost, 0, NOT_ATTEMPTED); printf(" -> %e", out); row(k)
                :: else -> skip
                fi
            };
#endif
            if
            :: st[k] == NONE || (!INSPECT_FORGETS_UNSENT && lost != 0 && own[k] == lost && st[k] == FAILED && fk[k] == NOT_ATTEMPTED) ->
                skip   /* nothing reserved (or nothing sent): run it again */
            :: else -> inspect(k); break
            fi
        fi
    :: atomic { natt >= MAXATT -> gaveup = 1 }; break
    od;
    t = 0; lost = 0
}

/* _adopt: a call of this run the run does not know holds the call (made before a reset) */
inline adopt(k) {
    /* the call it was held behind, as the reservation's answer named it: read once (an operator
       may release the held call meanwhile, and its row then names none) */
    j = hb[k];
    if
    :: j != NOKEY && !(inconv & (1 << j)) && !(adopted & (1 << j)) ->
        adopted = adopted | (1 << j);
        if
        :: st[j] == STARTED || st[j] == INDET ->
            inspect(j);
            if :: st[j] == INDET -> recon[j] = 1 :: else -> skip fi
        :: else -> skip
        fi
    :: else -> skip
    fi;
    j = 0
}

/* _call_write: the per-call protocol (workflows/write_calls.py) */
inline write_call(k) {
    gaveup = 0;
    send_once(k);
    do
    :: gaveup -> break
    :: !gaveup && cst == HELD ->
        adopt(k);
        /* asked again when nudged, and on a timer: the answer changes once the call it is held
           behind no longer holds it (settled, or its conflict closed), or an operator released it */
end_held:
        (st[k] != HELD || hb[k] == NOKEY || !HOLDS(hb[k]));
        send_once(k)
    :: !gaveup && cst == AWAIT ->
        if
        :: atomic { ap[k] || st[k] != AWAIT }; send_once(k)
        :: d_step {   /* the approval deadline: denied unless decided */
            printf("@@ deny k=%d by=deadline", k);
            if
            :: st[k] == AWAIT && !ap[k] -> settle_row(k, DENIED, KDENIED, BY_DEADLINE); out = O_OK
            :: else -> out = O_SETTLED
            fi;
            printf(" -> %e", out); row(k);
            read_row(k) };
            if :: cst == AWAIT -> send_once(k) :: else -> skip fi
        fi
    :: !gaveup && cst == STARTED -> inspect(k)   /* another attempt holds it: unknown */
    :: !gaveup && cst == INDET ->
        recon[k] = 1;
        if
        :: PAUSE ->
end_paused:
            atomic { IS_SETTLED(st[k]) -> read_row(k) }
        :: !PAUSE -> failedrun = 1; break   /* on_indeterminate: fail */
        fi
    :: else -> break
    od
}

/* What the model is told; the model's record of it is what `heard` and the properties use. */
inline tell(k) {
    {
        printf("@@ tell k=%d st=%e ver=%d src=%d\n", k, cst, cver, csrc);
        /* property: the model is never told an effect stands that the ledger says was undone or
           never happened, nor that an effect did not happen that the receiver applied */
        assert(cok);
        /* property: a reuse decision pairs one to one (pairing()) */
        assert(cpair);
        if
        :: IS_SETTLED(cst) -> told[k] = cst; toldv[k] = cver; tsrc[k] = csrc
        :: else -> skip
        fi;
        if
        :: cst == COMPLETED -> convsrc = convsrc | (1 << csrc)
        :: cst == FAILED || cst == DENIED -> toldfail[k] = 1; assert(eff[k] == 0 || mistaken[k])
        :: else -> skip
        fi
    }
}

inline make_call(k) {
    d_step {
        inconv = inconv | (1 << k);
        printf("@@ call k=%d pay=%d", k, pay[k]); print_turn(); printf("\n")
    }
}

inline print_turn() {
    i = 0;
    do
    :: i < NK -> if :: ths[i] != NONE -> printf(" h%d=%e/%d", i, ths[i], thv[i]) :: else -> skip fi; i++
    :: else -> break
    od
}

inline next_key(k) {
    /* the i-th call of a conversation after a reset gets the same id as before (a provider
       that repeats its ids) or a new one */
    if
    :: same && pos < nk -> k = pos
    :: else ->
        k = nk; nk++;
        if   /* its arguments: the same as every other call, or (PAYLOADS 2) other ones */
        :: PAYLOADS > 1 -> pay[k] = 1
        :: true -> pay[k] = 0
        fi
    fi;
    pos++
}

/* One call of the model's answer, from its reservation to what the model is told (the calls of one
 * answer run one after another, as AgentRunWorkflow runs them, or at once with PARALLEL, as a
 * framework's parallel tool calls do). A reset stops it wherever it is: its execution is gone. */
/* a finished call keeps nothing that tells two runs apart */
#define CALL_DONE k = 0; g = 0; j = 0; t = 0; lost = 0; glost = 0; cst = 0; cver = 0; csrc = 0; cok = 0; \
    cpair = 0; gaveup = 0; failedrun = 0

proctype Call(byte k; byte g) {
    byte j, t, lost;
    byte glost;                    /* ghost: a token whose reservation the run knows was never sent */
    mtype cst; byte cver, csrc;    /* the answer the workflow holds for the call */
    bit cok, cpair, gaveup, failedrun;
    {
        write_call(k);
        skip;
        d_step {
            if
            :: gaveup || failedrun -> runfailed = 1
            :: else -> tell(k)
            fi;
            running--;
            CALL_DONE
        }
    } unless { gen != g };
    d_step { CALL_DONE }
}

proctype Run() {
    byte turn, n, m, k, pos;
    byte ks[3];   /* the calls of one answer */
    bit same;
conv:
    {
        turn = 0; pos = 0;
        do
        :: turn < TURNS && !runfailed && (nk < NK || (same && pos < nk)) ->
            /* the model answers with one call, or with up to 1 + TWINS identical ones; this turn's
               heard list is the settled outcomes the model was told so far */
            atomic {
                i = 0;
                do
                :: i < NK -> ths[i] = told[i]; thv[i] = toldv[i]; thsrc[i] = tsrc[i]; i++
                :: else -> break
                od;
                turn++;
                next_key(ks[0]); n = 1;
                do
                :: n <= TWINS && (nk < NK || (same && pos < nk)) -> next_key(ks[n]); n++
                :: true -> break
                od
            };
            m = 0;
            do
            :: m < n -> make_call(ks[m]); m++
            :: else -> break
            od;
            /* calls of one answer do not hear each other: each is asked with this turn's list */
            m = 0;
            do
            :: m < n ->
                atomic { running++; run Call(ks[m], gen) };
                if
                :: !PARALLEL ->
end_one:
                    (running == 0)
                :: else -> skip
                fi;
                m++
            :: else -> break
            od;
end_all:
            (running == 0);
            d_step { m = 0; n = 0; k = 0; ks[0] = 0; ks[1] = 0; ks[2] = 0 }
        :: turn > 0 -> break   /* the final answer */
        :: else -> break
        od;
        rundone = 1;
end_over:
        (false)
    } unless { atomic { resetreq -> printf("@@ reset\n") } };
    /* a Temporal reset to the run's start: the model forgets what it heard; what was sent stays,
       and the calls of the old execution stop where they are */
    atomic {
        gen++; running = 0; resetreq = 0; rundone = 0; runfailed = 0; adopted = 0;
        m = 0; n = 0; k = 0; ks[0] = 0; ks[1] = 0; ks[2] = 0;
        i = 0;
        do
        :: i < NK -> told[i] = NONE; toldv[i] = 0; tsrc[i] = 0; toldfail[i] = 0; ths[i] = NONE; thv[i] = 0; thsrc[i] = 0; i++
        :: else -> break
        od;
        convsrc = 0; inconv = 0;
        if :: same = 1 :: same = 0 fi
    };
    goto conv
}
