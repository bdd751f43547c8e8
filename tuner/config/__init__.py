"""TODO config"""
