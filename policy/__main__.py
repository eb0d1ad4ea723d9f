"""Entry point of the policy pack. Constructing PolicyPack starts the policy server, so it happens
here only, never in a module the tests import."""

import sys
from pathlib import Path

# The pack runs from policy/; the project's names and UUID rules live one level up.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policy.rules import POLICIES

PolicyPack(name="hidden-gpu", enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
