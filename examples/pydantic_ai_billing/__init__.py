"""A Pydantic AI billing agent on Temporal whose credit goes through onceflow's ledger, once.

`python -m examples.pydantic_ai_billing` (or `make example-pydantic-ai`) runs it with no API key:
Pydantic AI's own FunctionModel plays the model. Needs the `pydantic-ai` and `dev` extras.
"""

from onceflow.local.extras import require_extra

require_extra("pydantic-ai", "pydantic_ai")
