"""The machines: the inventory read into task slots, SSH and its files, and the agent links with their fan-out."""
