"""MCP tools (issue 38, item 7): the tools of MCP servers the operator or the repository declares, through the
official ``mcp`` SDK — stdio servers in the task's sandbox, remote ones through its egress rules."""
