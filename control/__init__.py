"""The control plane: the one writer of liftgate's configuration and rollout state.

Experiments, variants, upstreams, client API keys, metric definitions, rollout state
(stage, weights, status, decisions), offline gate declarations and gate decisions are
written here and nowhere else, and so is the audit log. Every writer — the admin API
(:mod:`control.api`), the CLI through it, the rollout controller, the offline gate — goes
through the same three disciplines:

- one credential and role check (:mod:`control.auth`: the bootstrap admin token, the read
  token, users' API tokens and dashboard sessions with their CSRF tokens; roles viewer <
  operator < admin compared in :func:`control.auth.denial` only; the actor ``user:<name>``,
  or ``admin:<name>`` from ``X-Liftgate-Actor`` for the bootstrap token);
- one lock per experiment (:mod:`control.locking`: a transaction-scoped advisory lock,
  then the rows re-read ``FOR UPDATE`` in the same transaction);
- one audit writer (:mod:`control.audit`: actor, action, entity, before/after, secrets
  masked), in the same transaction as the change it records.

It imports ``contracts`` only: the gateway (data plane), the analytics service (which
serves the admin API) and the offline evals all call into it.
"""
