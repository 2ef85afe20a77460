/* onceflow's write protocol, as a Promela model for SPIN (docs/reliability.md, "The protocol, model
 * checked"). Run it with `make model-check`, or tests/test_protocol_model.py; model/README.md
 * is not needed: every knob is here, with its default, and the switches that set back one rule of
 * issue 34 each to the code as it had it.
 *
 * Bounds (override with -D at `spin -a`): */
#ifndef NCALLS
#define NCALLS 3          /* calls (keys) the model makes in the run, over all turns and resets */
#endif
#ifndef NK
#define NK 3              /* rows: keys c0..c(NK-1) */
#endif
#ifndef MAXATT
#define MAXATT 6          /* write activity attempts in the run (owner tokens 1..MAXATT) */
#endif
#ifndef CRASHES
#define CRASHES 1         /* worker crashes (an attempt dies at any step) */
#endif
#ifndef SLOWS
#define SLOWS 1           /* activity deadlines that pass while the attempt is still alive */
#endif
#ifndef TIMEOUTS
#define TIMEOUTS 1        /* tool timeouts while the request is still on the wire */
#endif
#ifndef OPS
#define OPS 2             /* operator actions */
#endif
#ifndef RESETS
#define RESETS 0          /* Temporal resets of the run */
#endif
#ifndef RESET_AT_END
#define RESET_AT_END 0    /* 1: the reset comes only once the run has given its final answer */
#endif
#ifndef MISTAKES
#define MISTAKES 0        /* settlements against the receiver's truth (operator or hook) */
#endif
#ifndef LOSTREPLIES
#define LOSTREPLIES 0     /* reservations that committed but whose answer was lost */
#endif
#ifndef TURNS
#define TURNS 2           /* model turns per conversation */
#endif
#ifndef TWINS
#define TWINS 1           /* an answer may hold 1 + TWINS identical calls (TWINS <= 2) */
#endif
#ifndef PARALLEL
#define PARALLEL 0        /* 1: the calls of one answer run at once (a framework's parallel tool calls) */
#endif
#ifndef PAYLOADS
#define PAYLOADS 1        /* 2: a call may have other arguments (not a twin; the entity guard's case) */
#endif
/* The world around the run: */
#ifndef RECEIVER
#define RECEIVER R_NOKEY  /* R_NOKEY (every arrival is an effect), R_KEY (dedup), R_KIT (+ lookup, fence) */
#endif
#ifndef HOOK
#define HOOK 1            /* the tool has a reconcile hook (a lookup at the receiver) */
#endif
#ifndef PAUSE
#define PAUSE 1           /* on_indeterminate: 1 pause (the model hears the settlement), 0 fail */
#endif
#ifndef APPROVAL
#define APPROVAL 0        /* the tool asks an operator before it is sent */
#endif
#ifndef INTENT
#define INTENT I_HOLD     /* the intent rule: I_HOLD (default), I_REUSE, I_ALLOW */
#endif
#ifndef EXCLUSIVE
#define EXCLUSIVE 0       /* one unresolved call per entity */
#endif
#ifndef LIMIT
#define LIMIT 0           /* a budget of LIMIT (every call draws 1); 0: none */
#endif
#ifndef COMPENSATE
#define COMPENSATE 1      /* operators may ask to compensate a completed call */
#endif
#ifndef REJECTS
#define REJECTS 1         /* the receiver may reject a request (a definite no: no effect) */
#endif
#ifndef NOTATTEMPTED
#define NOTATTEMPTED 1    /* the tool may fail "not attempted" before sending anything */
#endif
/* Issue 34's rules as the code had them (1 = old); each must make SPIN find a counterexample. */
#ifndef HEARD_BY_STATUS_NOW
#define HEARD_BY_STATUS_NOW 0   /* rule 1: heard = id in the list and settled now */
#endif
#ifndef REUSE_FROM_REUSED
#define REUSE_FROM_REUSED 0     /* rule 2: a reused call is a source of reuse */
#endif
#ifndef REUSE_NEWEST
#define REUSE_NEWEST 0          /* rule 3: the newest completed twin is reused, no pairing */
#endif
#ifndef LOST_REPLY_UNKNOWN
#define LOST_REPLY_UNKNOWN 0    /* rule 4: a lost reservation answer makes the call unknown */
#endif
#ifndef INSPECT_LIVE_LEASE
#define INSPECT_LIVE_LEASE 0    /* rule 5: inspection, adoption, reconcile ignore a live lease */
#endif
#ifndef STALE_OWNER_RESERVES
#define STALE_OWNER_RESERVES 0  /* rule 6: an attempt reserves after its activity's deadline */
#endif
/* Found by this model after issue 34, and since fixed on main (1 = the code before the fix):
 * UNKNOWN_LIVE_LEASE: the reconciler's hook settles "not there" inside the owner's lease (the
 *   owner's own timeout made the call unknown while its request may be on the wire).
 * INSPECT_FORGETS_UNSENT: after a lost reservation answer, a retry that is itself lost leaves the
 *   workflow's inspection to make unknown a call the run knows was never sent. */
#ifndef UNKNOWN_LIVE_LEASE
#define UNKNOWN_LIVE_LEASE 0
#endif
#ifndef INSPECT_FORGETS_UNSENT
#define INSPECT_FORGETS_UNSENT 0
#endif
/* Found by the larger bounds (a reset, a crash, a slow attempt) after F1 and F2:
 * INSPECT_REUSED_AS_IS: an inspection reads a reused call back as `completed` with its source's
 *   result though an operator compensated the source since (the reserve path told it so). */
#ifndef INSPECT_REUSED_AS_IS
#define INSPECT_REUSED_AS_IS 0
#endif
/* STALE_ATTEMPT_RETRIES (F4): an attempt retries a call that failed after it began (an attempt of
 *   the execution a reset replaced retries what the new execution was told failed). */
#ifndef STALE_ATTEMPT_RETRIES
#define STALE_ATTEMPT_RETRIES 0
#endif
#ifndef COMP_NUDGE_ONLY
#define COMP_NUDGE_ONLY 0       /* rule 7: CompensationWorkflow waits for a nudge, no timer */
#endif

#define R_NOKEY 0
#define R_KEY 1
#define R_KIT 2
#define I_HOLD 0
#define I_REUSE 1
#define I_ALLOW 2

#include "ledger.pml"
#include "protocol.pml"
#include "world.pml"
