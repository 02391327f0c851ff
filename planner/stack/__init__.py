"""Floor 1: the software stack a plan runs on (planner/stack/spec.py) and its bundled profiles
(profiles/stacks/*.json, loaded by planner/stack/profiles.py). Beside hardware: the cost and
memory models (floor 2) read every run option from a Stack."""

from planner.stack.profiles import (DEFAULT_STACK, LAUNCHER_STACKS, bundled_names, bundled_stacks,
                                    default_stack, load_stack, load_stack_file, resolve_stack,
                                    stack_from_dict, with_overrides)
from planner.stack.components import (Component, bundled_components, load_component,
                                      with_components)
from planner.stack.spec import OPTION_FIELDS, Stack

__all__ = ["Component", "DEFAULT_STACK", "LAUNCHER_STACKS", "OPTION_FIELDS", "Stack",
           "bundled_components", "bundled_names", "bundled_stacks", "default_stack",
           "load_component", "load_stack", "load_stack_file", "resolve_stack", "stack_from_dict",
           "with_components", "with_overrides"]
