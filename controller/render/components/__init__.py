"""One module per component: each turns the spec into that component's steps for one node.

Each module exposes ``steps(inp: RenderInput) -> list[Step]`` and renders its ``<name>.j2``
template; ``tether.controller.render.plan`` puts them in holodeck's order.
"""
