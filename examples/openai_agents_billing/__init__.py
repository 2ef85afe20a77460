"""An OpenAI Agents SDK billing agent on Temporal whose credit goes through onceflow's ledger, once.

`python -m examples.openai_agents_billing` (or `make example-openai-agents`) runs it with no API key:
a scripted Model (the SDK's Model interface) plays the model. Needs the `openai-agents` and `dev`
extras.
"""

from onceflow.local.extras import require_extra

require_extra("openai-agents", "agents")
